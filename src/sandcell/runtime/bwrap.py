"""The bwrap runtime: namespaces + seccomp + cgroups + rlimits on the host kernel (weaker tier).

Opt-in only (SANDCELL_ALLOW_WEAK_ISOLATION=1): the program talks to the host kernel directly,
filtered by seccomp.py, instead of to gVisor's user-space kernel.

<state_dir>/sandboxes/<id>/        scratch of one sandbox (see scratch.py); these directories
                                   are 0711 so that bwrap, running as the sandbox's uid, can
                                   reach its bind sources (but list nothing)
<state_dir>/blank-disks/           one blank ext4 image per disk size, copied for each (ext4.py)
/sys/fs/cgroup/<ctl>/sandcell/<key>/<id>   its cgroup; <key> is derived from state_dir

A sandbox has its own network namespace: loopback only. A job with egress gets its proxy's
socket directory, its CA bundle and the in-sandbox bridge, as under gVisor (see network.py).

Every sandbox runs as a host uid of its own (from a range derived from state_dir), mapped to
65534 inside its user namespace. Per-user kernel limits (inotify instances, pipe buffers,
RLIMIT_NPROC, user namespaces) are then per sandbox, never shared between tenants. A uid is
used again only once no process runs as it (UidPool), a second proof next to the empty
cgroup that nothing of a tenant's sandbox reaches the next one.
"""

import collections
import contextlib
import logging
import os
import re
import shutil
import stat
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import SandboxResult, SandboxSink, SandboxSpec
from sandcell.runtime import cgroups, reap
from sandcell.runtime.bwrap_run import (
    LAUNCH_ENV,
    BwrapRun,
    args_memfd,
    cgroup_limits,
    chain_fds,
    isolation_args,
    launcher,
    memfd_with,
    processes_by_uid,
)
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.disk_shelf import DiskShelf
from sandcell.runtime.guest_mounts import GUEST_SOURCE
from sandcell.runtime.launch import launch_helper
from sandcell.runtime.launch_mounts import LaunchMounts
from sandcell.runtime.scratch import Scratch, probe_loop_disk, scratch_blanks
from sandcell.runtime.seccomp import compile_filter
from sandcell.runtime.volatile import (
    ensure_tmpfs,
    remove_if_empty,
    state_key,
    volatile_dir,
)

log = logging.getLogger("sandcell.runtime.bwrap")

SANDBOX_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # names dirs and cgroups
TOOLS = ("bwrap", "cc", "unshare", "mount")  # cc: launch.c; the last two: jobs with egress
UID_BASE, UID_BLOCK, UID_BLOCKS = 1_000_000_000, 65536, 16384  # stays below 2**31
VERIFY_BATCH = 64  # released uids verified by one scan of /proc (UidPool)
PROBE_TIMEOUT_S = 30
# What the probe sandbox must report about itself: the seccomp filter is on (mode 2),
# no_new_privs is set and not one capability is left, in any set.
PROBE_EXPECTS = {"Seccomp:": "2", "NoNewPrivs:": "1"}
PROBE_LIMITS = Limits(memory_mb=64, pids=8)
# The probe needs no image: the host's /usr, read-only, is enough to run `cat`.
PROBE_FS = "--ro-bind /usr /usr --symlink usr/lib /lib --symlink usr/lib64 /lib64 --proc /proc"
PROBE_COMMAND = ("/usr/bin/cat", "/proc/self/status")


class UidPool:
    """Host uids for sandboxes: one per running sandbox, reused only once verified unused.

    A released sandbox's uid is not free at once: it waits until a scan of /proc shows that
    nothing runs as it, and one that still has a process is never handed out again. One scan
    serves every uid released since the last (`batch` of them): a scan reads every process's
    status file, ~3.7 ms of CPU on a host busy with 16 sandboxes, too much to pay per sandbox.
    The first take scans too: an earlier worker with the same uids may have left a process.
    First in, first out: a uid comes back into use as late as possible.
    """

    def __init__(
        self,
        first: int,
        count: int,
        batch: int = VERIFY_BATCH,
        scan: Callable[[int, int], dict[int, list[int]]] = processes_by_uid,
    ) -> None:
        self.first, self.count, self.batch = first, count, batch
        self._scan = scan
        self._free = collections.deque(range(first, first + count))
        self._released: list[int] = []  # given back, not yet verified
        self._scanned = False
        self.quarantined: set[int] = set()
        self._lock = threading.Lock()

    def take(self) -> int:
        with self._lock:
            if not self._scanned or len(self._released) >= self.batch or not self._free:
                self._verify()
            if not self._free:
                raise RuntimeUnavailable("no free sandbox uid left")
            return self._free.popleft()

    def give_back(self, uid: int) -> None:
        """The uid of a released sandbox: free again once a scan finds nothing running as it."""
        with self._lock:
            self._released.append(uid)

    def verify(self) -> None:
        """Scan now: every uid given back with nothing running as it is free again."""
        with self._lock:
            self._verify()

    def free(self) -> int:
        with self._lock:
            return len(self._free)

    def quarantined_count(self) -> int:
        with self._lock:
            return len(self.quarantined)

    def _verify(self) -> None:
        running = self._scan(self.first, self.count)
        # The uids of running sandboxes have processes, rightly; only the released ones (and,
        # before the first take, every uid: none is ours yet) must have none.
        suspects = set(self._released) if self._scanned else set(running)
        self._scanned = True
        for uid in self._released:
            if uid not in running:
                self._free.append(uid)
        self._released.clear()
        for uid in suspects & running.keys():
            log.error(
                "processes %s run as sandbox uid %d: it is never handed out again",
                running[uid],
                uid,
            )
            self.quarantined.add(uid)
            with contextlib.suppress(ValueError):  # left by an earlier worker: still "free"
                self._free.remove(uid)


class BwrapRuntime:
    name = "bwrap"

    def __init__(self, state_dir: Path, *, overhead_mb: int = 16) -> None:
        self.state_dir = state_dir
        self.run_dir = volatile_dir(state_dir)
        self.sandboxes_dir = self.run_dir / "sandboxes"
        self.disks_dir = state_dir / "disks"
        self.blanks = scratch_blanks(state_dir / "blank-disks")
        self.shelf = DiskShelf(self.sandboxes_dir, self.disks_dir, self.blanks)
        self.launch_mounts = LaunchMounts(self.sandboxes_dir)
        self.overhead_mb = overhead_mb  # bwrap's own two processes and the wrapper shell
        key = state_key(state_dir)
        self.cgroup_parent = f"sandcell/{key}"
        block = int(key, 16) % UID_BLOCKS  # two state dirs on one host: two uid ranges
        self.uids = UidPool(UID_BASE + block * UID_BLOCK, UID_BLOCK)
        self._version: str | None = None
        self._seccomp: bytes | None = None

    def health_figures(self) -> dict[str, int]:
        return {"quarantined_uids": self.uids.quarantined_count()}

    def version(self) -> str:
        if self._version is None:
            try:
                done = subprocess.run(["bwrap", "--version"], capture_output=True, text=True)
            except OSError as exc:
                raise RuntimeUnavailable(f"bwrap cannot run: {exc}") from exc
            if done.returncode != 0:
                raise RuntimeUnavailable(f"bwrap --version failed: {done.stderr.strip()}")
            self._version = done.stdout.strip()
        return self._version

    def seccomp_filter(self) -> bytes:
        if self._seccomp is None:
            self._seccomp = compile_filter()
        return self._seccomp

    def check(self) -> None:
        """Fail closed: raise RuntimeUnavailable unless every protection can be applied."""
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if missing:
            raise RuntimeUnavailable(f"not on PATH: {', '.join(missing)}")
        if os.geteuid() != 0:
            raise RuntimeUnavailable("the bwrap runtime needs root (cgroups, loop disks, uids)")
        cgroups.require_v1()
        self.ensure_dirs()
        try:
            require_traversable(self.sandboxes_dir)
            require_traversable(self.disks_dir)
            require_traversable(GUEST_SOURCE)  # bound into every sandbox (guest_mounts.py)
            self.version()
            self.seccomp_filter()
            launch_helper()
            probe_loop_disk(self.state_dir)
            self._probe_sandbox()
        except Exception:
            self.close()  # closed, failing: its directories on the tmpfs and cgroups go too
            raise

    def run(self, spec: SandboxSpec, sink: SandboxSink, cancel: threading.Event) -> SandboxResult:
        if not SANDBOX_ID.match(spec.sandbox_id):
            return SandboxResult(None, Reason.RUNTIME_ERROR, "invalid sandbox id", released=True)
        self.ensure_dirs()
        scratch = self.scratch(spec.sandbox_id, spill=bool(spec.inputs))
        cgroup = SandboxCgroup(f"{self.cgroup_parent}/{spec.sandbox_id}")
        if cgroup.exists() or not scratch.claim():  # atomic: never touch another run's id
            detail = f"sandbox id {spec.sandbox_id} is already in use"
            return SandboxResult(None, Reason.RUNTIME_ERROR, detail, released=True)
        try:
            uid = self.uids.take()
        except RuntimeUnavailable as exc:
            scratch.teardown()
            return SandboxResult(None, Reason.RUNTIME_ERROR, str(exc), released=True)
        result = self._execute(spec, sink, cancel, scratch, cgroup, uid)
        if result.released:  # a uid something may still run as is never handed out again
            self.uids.give_back(uid)
        return result

    def _execute(
        self,
        spec: SandboxSpec,
        sink: SandboxSink,
        cancel: threading.Event,
        scratch: Scratch,
        cgroup: SandboxCgroup,
        uid: int,
    ) -> SandboxResult:
        try:
            seccomp, helper = self.seccomp_filter(), launch_helper()
        except RuntimeUnavailable as exc:
            scratch.teardown()
            return SandboxResult(None, Reason.RUNTIME_ERROR, str(exc), released=True)
        run = BwrapRun(
            spec,
            sink,
            cancel,
            scratch=scratch,
            cgroup=cgroup,
            uid=uid,
            seccomp=seccomp,
            helper=helper,
            overhead_mb=self.overhead_mb,
            mounts_fd=self.launch_mounts.fd(),
        )
        return run.execute()

    def reap(self) -> list[str]:
        """Remove what an earlier crash of a runtime with this state_dir left behind.

        Call it before the first `run`: it removes every sandbox this state_dir knows of.
        """
        self.shelf.close()
        scratch = reap.reap_scratch(self.sandboxes_dir, self.disks_dir)
        return reap.reap_cgroups(self.cgroup_parent) + scratch

    def close(self) -> None:
        """The worker is done with this runtime (every run returned): its parent cgroup and
        its volatile directory go, and the disks it kept for sandboxes to come."""
        self.shelf.close()
        self.launch_mounts.close()
        reap.remove_parent(self.cgroup_parent)
        remove_if_empty(self.sandboxes_dir, self.run_dir)

    def scratch(self, sandbox_id: str, spill: bool = True) -> Scratch:
        """The (not yet claimed) scratch of sandbox `sandbox_id`. Its disk is a kept one, so
        the spill on the state_dir's disk holds only inputs: without `spill` (a cold job with
        none), everything is on the tmpfs, and no directory is made and removed on the disk,
        whose new inodes cost a scan that grows with the job rate (volatile.py)."""
        return Scratch(
            self.sandboxes_dir / sandbox_id,
            self.blanks,
            spill=self.disks_dir / sandbox_id if spill else None,
            shelf=self.shelf,
        )

    def ensure_dirs(self) -> None:
        """Before every sandbox: the directories may have been removed (a reboot's /run, an
        operator); changed only if they must be, as a chmod is a write to the disk's journal."""
        ensure_tmpfs()
        for path in (self.state_dir, self.disks_dir, self.run_dir, self.sandboxes_dir):
            mode: int | None
            try:
                mode = stat.S_IMODE(path.stat().st_mode)
            except FileNotFoundError:
                path.mkdir(mode=0o711, parents=True, exist_ok=True)
                mode = None  # made under the umask: set it
            if mode != 0o711:
                path.chmod(0o711)  # traversable by the sandboxes' uids, listable only by root

    def _probe_sandbox(self) -> None:
        """Start one sandbox over the host's /usr exactly as jobs start, and ask it about itself.

        This proves that user namespaces work here and that the filter, no_new_privs and the
        capability drop are really in force; anything else is RuntimeUnavailable.
        """
        status = self._probe_status()
        for key, expected in PROBE_EXPECTS.items():
            if status.get(key) != expected:
                raise RuntimeUnavailable(
                    f"bwrap probe: {key} is {status.get(key)!r}, not {expected}"
                )
        caps = [k for k, v in status.items() if k.startswith("Cap") and int(v, 16) != 0]
        if caps or status.get("Uid:") != "65534":
            raise RuntimeUnavailable(f"bwrap probe: uid {status.get('Uid:')}, capabilities {caps}")

    def _probe_status(self) -> dict[str, str]:
        """/proc/self/status of `cat`, run under the full isolation over the host's /usr."""
        helper = launch_helper()
        cgroup = SandboxCgroup(f"{self.cgroup_parent}/.probe-{os.getpid()}")
        cgroup.create(cgroup_limits(PROBE_LIMITS, self.overhead_mb))
        uid = self.uids.take()
        seccomp_fd = memfd_with("sandcell-seccomp", self.seccomp_filter())
        args_fd = args_memfd([*isolation_args(seccomp_fd), *PROBE_FS.split()])
        mounts_fd = self.launch_mounts.fd()
        argv = launcher(
            helper, cgroup, uid, PROBE_LIMITS, args_fd, list(PROBE_COMMAND), None, mounts_fd
        )
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                pass_fds=chain_fds([seccomp_fd, args_fd], mounts_fd),
                env=LAUNCH_ENV,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeUnavailable(f"bwrap probe failed: {exc}") from exc
        finally:
            os.close(seccomp_fd)
            os.close(args_fd)
            cgroup.kill_all()
            cgroup.remove()
            self.uids.give_back(uid)
        if done.returncode != 0:
            raise RuntimeUnavailable(f"bwrap cannot start a sandbox: {done.stderr.strip()[-500:]}")
        return _status_fields(done.stdout)


def require_traversable(path: Path) -> None:
    """bwrap runs as the sandbox's uid and opens its bind sources by path: every directory
    above them must let others through (o+x), or no sandbox could start."""
    for directory in [path, *path.parents]:
        if not directory.stat().st_mode & stat.S_IXOTH:
            raise RuntimeUnavailable(
                f"{directory} is not traversable by other users (o+x): the bwrap runtime "
                "needs its state directory under world-traversable directories"
            )


def _status_fields(text: str) -> dict[str, str]:
    """The lines of a /proc status file as {"Key:": its first value}."""
    fields = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            fields[parts[0]] = parts[1]
    return fields
