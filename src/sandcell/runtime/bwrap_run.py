"""One bwrap sandbox from scratch disk to release: launch, watch every limit, decide the reason.

The launch chain, each step exec'ing the next so that nothing runs outside the cgroup:

    launch      (launch.c, as root) joins the sandbox's cgroup in every controller, sets the
                rlimits NOFILE, CORE 0, FSIZE (the disk size) and NPROC, soft and hard, then
                becomes the sandbox's own host uid: no groups, no capabilities, no_new_privs
    [unshare]   with egress only, between the two: still root, a mount namespace of the
                chain's own, in which the job's proxy socket directory is bound into the
                scratch (see network.py); then `launch` again, for the uid step alone
    bwrap       new user/pid/net/ipc/uts/mount/cgroup namespaces, uid 65534 inside, the
                seccomp filter, the image root read-only; its arguments come from a memfd
                (`--args`), so the sandbox's pid 1 shows no host paths in its cmdline

How each reason is told apart (first match wins), as in the gVisor runtime:

- cancelled / timeout / output_limit: the watch loop saw it and killed the whole cgroup;
- memory: the cgroup's `oom_kill` counter moved (the kernel OOM killer took a guest process);
- pids: the cgroup's `pids.events` max counter moved (a fork or thread past `pids` failed);
- runtime_error: bwrap could not build the sandbox: the ready line never came, or, for a
  program run as it is (`command`), bwrap's status reports no exit code;
- none: exit status 0;
- disk: a failing exit while the scratch disk has no free blocks or inodes left;
- exit_code: any other failing exit (128 + n for death by signal n, as bwrap reports it).
"""

import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path

from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import SandboxResult, SandboxSink, SandboxSpec
from sandcell.runtime.bundle import NOFILE, check_env, ready_wrapper, runs_own_code
from sandcell.runtime.cgroups import CgroupLimits, SandboxCgroup
from sandcell.runtime.guest_mounts import guest_binds
from sandcell.runtime.launch import join_steps
from sandcell.runtime.network import (
    BRIDGE_MEMORY_MB,
    BRIDGE_TASKS,
    BWRAP_MOUNT_POINT,
    bwrap_egress_args,
    bwrap_egress_launch,
)
from sandcell.runtime.one_shot import EXIT_WAIT_S, OneShotRun
from sandcell.runtime.scratch import GUEST_UID, Scratch
from sandcell.runtime.settle import settled
from sandcell.runtime.streams import Streams

START_TIMEOUT_S = 30.0
# Tasks of bwrap itself in the cgroup: the outer process and the sandbox's pid 1 (which reaps
# orphans, so that the program is never pid 1 with its odd signal rules).
BWRAP_TASKS = 2
MiB = 1024 * 1024
UID_FIELD = b"\nUid:\t"  # in /proc/<pid>/status
WORKDIR = "/workspace"
LAUNCH_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def cgroup_limits(limits: Limits, overhead_mb: int, egress: bool = False) -> CgroupLimits:
    # bwrap's two tasks, and the egress bridge's task and memory, are ours: the program gets
    # exactly `pids` and `memory_mb`, and one more task trips the limit.
    memory_mb = limits.memory_mb + overhead_mb + (BRIDGE_MEMORY_MB if egress else 0)
    return CgroupLimits(memory_mb * MiB, limits.cpu, limits.pids + _tasks_of_ours(egress))


def _tasks_of_ours(egress: bool) -> int:
    return BWRAP_TASKS + (BRIDGE_TASKS if egress else 0)


def isolation_args(seccomp_fd: int) -> list[str]:
    """Namespaces, identity, capabilities, seccomp: the same for every sandbox and the probe."""
    return [
        *("--unshare-all", "--unshare-user", "--disable-userns"),
        *("--uid", str(GUEST_UID), "--gid", str(GUEST_UID), "--hostname", "sandbox"),
        *("--die-with-parent", "--new-session", "--cap-drop", "ALL"),
        *("--seccomp", str(seccomp_fd)),
    ]


def bwrap_args(
    spec: SandboxSpec, scratch: Scratch, seccomp_fd: int, ca_fd: int | None = None
) -> list[str]:
    """Everything the sandbox may see or do, as bwrap options (the command goes apart).

    `ca_fd`: the job's CA bundle, for a job with egress (its socket directory is bound on
    `egress_mount_point` by the launch chain, see `launcher`).
    """
    tmpfs_bytes = str(spec.limits.memory_mb * MiB)  # tmpfs pages count against the cgroup too
    env = [arg for key, value in spec.env.items() for arg in ("--setenv", key, value)]
    return [
        *isolation_args(seccomp_fd),
        *("--ro-bind", str(spec.image.rootfs), "/", "--proc", "/proc", "--dev", "/dev"),
        *("--perms", "1777", "--size", tmpfs_bytes, "--tmpfs", "/tmp"),
        *("--perms", "1777", "--size", tmpfs_bytes, "--tmpfs", "/dev/shm"),
        *("--ro-bind", str(scratch.job), "/job", "--ro-bind", str(scratch.input), "/input"),
        *[arg for src, dest in guest_binds(spec) for arg in ("--ro-bind", str(src), dest)],
        *(bwrap_egress_args(egress_mount_point(scratch), ca_fd) if ca_fd is not None else []),
        *("--bind", str(scratch.workspace), WORKDIR),
        *("--bind", str(scratch.output), "/output"),
        *("--chdir", WORKDIR, "--clearenv", *env),
    ]


def command(spec: SandboxSpec) -> list[str]:
    """What bwrap runs. A job's own code runs as it is, one exec and a shell fewer (0.7 ms of
    CPU a job: `python -m bench.first_process`); bwrap's status tells whether it ran
    (`ran_program`). That needs PWD in the spec's environment, as jobs have it: bwrap sets
    it, and the wrapper is what takes it out otherwise.

    Anything else gets the wrapper that starts the egress bridge if the job has egress,
    prints the ready line, then becomes the program: a command that cannot be found is then
    the job's failure (exit 127), not the sandbox's."""
    if runs_as_is(spec):
        return spec.argv
    bridge = spec.image.python if spec.egress is not None else None
    return [*ready_wrapper(spec.env, bridge), *spec.argv]


def runs_as_is(spec: SandboxSpec) -> bool:
    return runs_own_code(spec) and spec.env.get("PWD") == WORKDIR


def ran_program(status: bytes) -> bool:
    """Whether bwrap ran its command, from what it wrote to `--json-status-fd`: the exit code
    is reported only for a command it managed to exec, never for a sandbox it could not set
    up (bwrap 0.8's status carries `"exit-code"` then, and only then)."""
    return b'"exit-code"' in status


def egress_mount_point(scratch: Scratch) -> Path:
    return scratch.root / BWRAP_MOUNT_POINT


def args_memfd(args: list[str]) -> int:
    """bwrap reads its arguments from here (`--args FD`), NUL-separated."""
    return memfd_with("sandcell-bwrap-args", b"".join(arg.encode() + b"\0" for arg in args))


def launcher(
    helper: str,
    cgroup: SandboxCgroup,
    uid: int,
    limits: Limits,
    args_fd: int,
    argv: list[str],
    egress_step: list[str] | None = None,
    mounts_fd: int | None = None,
) -> list[str]:
    """The launch chain from `helper` (launch.launch_helper); `egress_step`
    (network.bwrap_egress_launch) for a job with egress; `mounts_fd`, the mount namespace
    bwrap starts from (launch_mounts.py), entered once the cgroups are joined through /sys."""
    # A backstop: the cgroup's pids.max trips first.
    nproc = limits.pids + _tasks_of_ours(egress_step is not None) + 1
    confine = [
        *join_steps(cgroup),
        *("nofile", str(NOFILE), "core", "0", "fsize", str(limits.disk_mb * MiB)),
        *("nproc", str(nproc)),
        *(("mounts", str(mounts_fd)) if mounts_fd is not None else ()),
    ]
    become = ["uid", str(uid), "--", "bwrap", "--args", str(args_fd), "--", *argv]
    if egress_step is None:
        return [helper, *confine, *become]
    return [helper, *confine, "--", *egress_step, helper, *become]


def chain_fds(fds: list[int], mounts_fd: int | None) -> tuple[int, ...]:
    """What the launch chain inherits: `fds` (bwrap's), and the launch namespace's, if any."""
    return (*fds, *([] if mounts_fd is None else [mounts_fd]))


def teardown_scratch(scratch: Scratch, sandbox_gone: bool) -> list[str]:
    """Unmount and detach the scratch disk, waiting a moment if the kernel is still busy; or,
    if the sandbox is gone (its cgroup removed), give the disk back to be kept (disk_shelf.py).

    The sandbox's mount namespace (and a concurrent bwrap's copy of the host's mounts) can
    outlive the last process by a moment, holding the loop device: then it is detached only
    once the kernel lets go of it.
    """
    problems: list[str] = []

    def released() -> bool:
        problems[:] = scratch.teardown(sandbox_gone)  # idempotent: only what is left is redone
        return not problems

    settled(released, EXIT_WAIT_S)
    return problems


def memfd_with(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, os.MFD_CLOEXEC)  # pass_fds hands it to bwrap, and nobody else
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def processes_by_uid(first: int, count: int) -> dict[int, list[int]]:
    """Live host processes whose real uid is in [first, first + count), by uid: one read of
    every status file, whatever the number of uids asked about.

    Zombies are left out: they run nothing and hold nothing, and bwrap's pid 1 can be one for
    a moment after the outer bwrap exits (the host's init reaps it). Raw reads of the head of
    each status file: the kernel formats the whole file for each, ~10-20 us a process.
    """
    found: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        head = _status_head(f"/proc/{name}/status")
        field = head.find(UID_FIELD)
        if field < 0 or b"\nState:\tZ" in head:
            continue
        at = field + len(UID_FIELD)
        uid = int(head[at : head.index(b"\t", at)])  # the real uid: the first of four
        if first <= uid < first + count:
            found.setdefault(uid, []).append(int(name))
    return found


def _status_head(path: str) -> bytes:
    """The first KiB of a /proc status file (Name to Gid); empty if the process is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        return os.read(fd, 1024)
    except OSError:
        return b""
    finally:
        os.close(fd)


class BwrapRun(OneShotRun):
    def __init__(
        self,
        spec: SandboxSpec,
        sink: SandboxSink,
        cancel: threading.Event,
        *,
        scratch: Scratch,
        cgroup: SandboxCgroup,
        uid: int,
        seccomp: bytes,
        helper: str,
        overhead_mb: int,
        mounts_fd: int | None = None,
    ) -> None:
        self.spec, self.sink, self.cancel = spec, sink, cancel
        self.scratch, self.cgroup, self.uid = scratch, cgroup, uid
        self.seccomp, self.helper, self.overhead_mb = seccomp, helper, overhead_mb
        self.mounts_fd = mounts_fd  # the runtime's (launch_mounts.py): passed, never closed
        self.limits = spec.limits
        self.proc: subprocess.Popen[bytes] | None = None
        self.streams: Streams | None = None
        self.kill_reason: Reason | None = None
        self.launched_at = 0.0
        self.usage: dict[str, float] = {}
        self.status_fd: int | None = None  # bwrap's status, for a program run as it is

    def _prepare(self) -> None:
        check_env(self.spec.env)
        self.scratch.let_through()
        self.scratch.create(self.spec.code, self.spec.inputs, self.limits.disk_mb)
        for path in (self.scratch.workspace, self.scratch.output):
            os.chown(path, self.uid, self.uid)  # seen as 65534 inside, and writable only there
        self.scratch.restore_outputs(self.spec.restore_outputs, self.uid)
        egress = self.spec.egress is not None
        if egress:  # the socket directory is bound on it in the launch chain's namespace only
            egress_mount_point(self.scratch).mkdir(mode=0o700)
        self.cgroup.create(cgroup_limits(self.limits, self.overhead_mb, egress))

    def _launch(self) -> Streams:
        fds: list[int] = []
        try:
            argv = self._launch_chain(fds)
            self.launched_at = time.monotonic()
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=LAUNCH_ENV,  # nothing of the worker's environment reaches the sandbox
                pass_fds=chain_fds(fds, self.mounts_fd),
                start_new_session=True,
            )
        finally:
            for fd in fds:
                os.close(fd)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        cap = int(self.limits.output_mb * MiB)
        ready_line = self.status_fd is None
        self.streams = Streams(
            self.proc.stdout, self.proc.stderr, self.sink, cap, ready_line=ready_line
        )
        self.streams.start()
        return self.streams

    def _launch_chain(self, fds: list[int]) -> list[str]:
        """The launch argv; the memfds bwrap reads (and closes) are added to `fds`: the seccomp
        filter, the job's CA bundle if it has egress, and bwrap's own options."""
        spec, egress = self.spec, self.spec.egress
        fds.append(seccomp_fd := memfd_with("sandcell-seccomp", self.seccomp))
        ca_fd = None
        if egress is not None:
            fds.append(ca_fd := memfd_with("sandcell-ca-bundle", egress.ca_bundle.read_bytes()))
        args = bwrap_args(spec, self.scratch, seccomp_fd, ca_fd)
        if runs_as_is(spec):  # no ready line: bwrap's status tells whether it ran
            self.status_fd, status_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
            fds.append(status_w)
            args += ["--json-status-fd", str(status_w)]
        fds.append(args_fd := args_memfd(args))
        step = bwrap_egress_launch(egress, egress_mount_point(self.scratch)) if egress else None
        return launcher(
            self.helper,
            self.cgroup,
            self.uid,
            self.limits,
            args_fd,
            command(spec),
            step,
            self.mounts_fd,
        )

    def _limit_crossed(self, streams: Streams) -> Reason | None:
        if self.cancel.is_set():
            return Reason.CANCELLED
        if streams.error is not None:
            return Reason.INTERNAL
        if streams.budget.exceeded.is_set():
            return Reason.OUTPUT_LIMIT
        now = time.monotonic()
        if (counted := self._cgroup_limit(streams, now)) is not None:
            return counted
        if streams.ready_at is None:
            return Reason.RUNTIME_ERROR if now > self.launched_at + START_TIMEOUT_S else None
        return Reason.TIMEOUT if now > streams.ready_at + self.limits.timeout_s else None

    def _kill(self) -> bool:
        """SIGKILL every process of the sandbox; True once none is left.

        bwrap's outer process goes last: it reaps the sandbox's pid 1 and then exits by itself.
        Killed first, it would leave that pid 1 to the host's init, as a zombie for a while.
        """
        if self.proc is not None and self.proc.poll() is None:
            self.cgroup.kill_all(EXIT_WAIT_S, spare=frozenset({self.proc.pid}))
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(EXIT_WAIT_S)
        return self.cgroup.kill_all()

    def _decide(self, streams: Streams, exit_code: int) -> SandboxResult:
        if self.kill_reason is not None:
            return SandboxResult(None, self.kill_reason, self._describe(self.kill_reason))
        for reason, crossed in (
            (Reason.OUTPUT_LIMIT, streams.budget.exceeded.is_set()),  # cut after it ended
            (Reason.MEMORY, self.cgroup.oom_kills() > 0),
            (Reason.PIDS, self.cgroup.pids_limit_hits() > 0),
        ):
            if crossed:
                return SandboxResult(None, reason, self._describe(reason))
        if streams.ready_at is None or not self._ran_program():
            said = streams.early_text()
            detail = f"bwrap failed to start the sandbox (exit {exit_code}): {said}"
            return SandboxResult(None, Reason.RUNTIME_ERROR, detail)
        if exit_code == 0:
            return SandboxResult(0, None)
        if self.scratch.disk_full():
            return SandboxResult(exit_code, Reason.DISK, self._describe(Reason.DISK))
        return SandboxResult(exit_code, Reason.EXIT_CODE, f"exit code {exit_code}")

    def _ran_program(self) -> bool:
        """Whether bwrap ran the program, for a run without a ready line (bwrap has exited:
        its status is all written)."""
        if self.status_fd is None:
            return True
        status = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.status_fd, 4096):
                status += chunk
        return ran_program(status)

    def _describe(self, reason: Reason) -> str:
        limits = self.limits
        assert self.streams is not None
        return {
            Reason.CANCELLED: "cancelled",
            Reason.TIMEOUT: f"wall-clock limit of {limits.timeout_s:g} s",
            Reason.OUTPUT_LIMIT: f"output limit of {self.streams.budget.cap} bytes",
            Reason.PIDS: f"process limit of {limits.pids}",
            Reason.MEMORY: f"memory limit of {limits.memory_mb} MB",
            Reason.DISK: f"disk limit of {limits.disk_mb} MB",
            Reason.INTERNAL: f"the output sink failed: {self.streams.error!r}",
        }.get(reason, f"the sandbox did not start within {START_TIMEOUT_S:g} s")

    def _force_kill(self) -> None:
        self._kill()

    def _release(self) -> list[str]:
        """Remove everything of this sandbox from the host; return what is still there."""
        if self.status_fd is not None:
            os.close(self.status_fd)
            self.status_fd = None
        problems: list[str] = []
        try:
            problems += self._empty_cgroup()
        except OSError as exc:  # keep releasing what can be released
            problems.append(f"empty cgroup: {exc}")
        try:
            problems += teardown_scratch(self.scratch, sandbox_gone=not problems)
        except OSError as exc:
            problems.append(f"teardown scratch: {exc}")
        return problems

    def _empty_cgroup(self) -> list[str]:
        if not self._kill():
            return ["processes left in the cgroup"]
        if self.proc is not None:
            self.proc.wait(EXIT_WAIT_S)  # our direct child: reap it, or it stays a zombie
        return [] if self.cgroup.remove() else [f"cgroup {self.cgroup.relpath}"]
