"""One sandbox from bundle to release: launch runsc, watch every limit, decide the reason.

How each reason is told apart (first match wins):

- cancelled / timeout / output_limit / pids (tripwire): the watch loop saw it and killed;
  the pids tripwire is the guest taking the one task slot above its budget (RLIMIT_NPROC is
  pids + 1 inside gVisor, plus the egress bridge's task when there is one, which every count
  below leaves out): the count of ptrace stubs on the host flags it, `runsc events` confirms it;
- output_limit: output was cut even though the program had ended on its own meanwhile;
- pids (refused fork): the sentry refused a fork with EAGAIN (RLIMIT_NPROC), seen in its strace
  of the fork family (fork_watch.py); exact, even for a bomb that dies on its first refusal;
- memory: the cgroup's `oom_kill` counter moved (the host OOM killer took the sentry);
- pids (host backstop): the cgroup's `pids.events` max counter moved;
- runtime_error: the ready line never came (runsc or the bundle failed);
- none: exit status 0;
- disk: a failing exit while the scratch disk has no free blocks or inodes left;
- pids (after the fact): a failing exit after the guest reached its process cap;
- exit_code: any other failing exit.
"""

import contextlib
import subprocess
import threading
import time
from pathlib import Path

from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import SandboxResult, SandboxSink, SandboxSpec
from sandcell.runtime.bundle import (
    check_env,
    nproc_limit,
    oci_config,
    require_mount_points,
    write_config,
)
from sandcell.runtime.cgroups import CgroupLimits, SandboxCgroup
from sandcell.runtime.fork_watch import ForkWatch
from sandcell.runtime.guest_mounts import (
    ensure_guest_package,
    needs_host_sockets,
    oci_guest_mounts,
)
from sandcell.runtime.launch import in_cgroup
from sandcell.runtime.network import BRIDGE_MEMORY_MB, BRIDGE_TASKS
from sandcell.runtime.one_shot import EXIT_WAIT_S, OneShotRun
from sandcell.runtime.reap import left_on_host
from sandcell.runtime.runsc import Runsc, RunscError
from sandcell.runtime.scratch import GUEST_UID, Scratch
from sandcell.runtime.streams import Streams

START_TIMEOUT_S = 30.0  # runsc boot, before the program's own clock starts
PIDS_CONFIRM_FIRST_S, PIDS_CONFIRM_MAX_S = 0.125, 4.0  # `runsc events` costs ~60 ms of CPU
BOOT_CPUS = 1.0
# Host processes of a sandbox that are not guest address spaces: the runsc CLI, the gofer,
# the sentry, and the spare stub the ptrace platform keeps. Each guest process adds one stub.
RUNSC_HOST_PROCS = 4
# Host tasks (threads) the sandbox may use: the sentry and the ptrace stubs need many per guest
# process. A backstop that keeps one sandbox from exhausting the host's pid space (pid_max is
# often 32768); the guest's own cap is RLIMIT_NPROC inside gVisor.
HOST_TASKS_BASE, HOST_TASKS_PER_GUEST, HOST_TASKS_MAX = 1024, 32, 8192
# runsc gets a clean environment: nothing of the worker's reaches it or the sandbox.
RUNSC_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
MiB = 1024 * 1024


def cgroup_limits(limits: Limits, overhead_mb: int, egress: bool = False) -> CgroupLimits:
    # The host limit also covers gVisor itself (sentry, gofer, runsc; ~46 MB) and the egress
    # bridge: tripping it kills the whole sandbox, so the guest's budget is memory_mb on top.
    overhead_mb += BRIDGE_MEMORY_MB if egress else 0
    guest_tasks = nproc_limit(limits, egress)
    tasks = min(HOST_TASKS_MAX, HOST_TASKS_BASE + HOST_TASKS_PER_GUEST * guest_tasks)
    return CgroupLimits((limits.memory_mb + overhead_mb) * MiB, boot_cpus(limits), tasks)


def boot_cpus(limits: Limits) -> float:
    """CPU quota while gVisor boots (~0.15 CPU-s): at 0.05 cores that alone would take 3 s.

    The tenant's own quota replaces it as soon as the ready line arrives (within one tick).
    """
    return max(limits.cpu, BOOT_CPUS)


class SandboxRun(OneShotRun):
    def __init__(
        self,
        spec: SandboxSpec,
        sink: SandboxSink,
        cancel: threading.Event,
        runsc: Runsc,
        scratch: Scratch,
        cgroup: SandboxCgroup,
        overhead_mb: int,
    ) -> None:
        self.spec, self.sink, self.cancel = spec, sink, cancel
        self.runsc, self.scratch, self.cgroup = runsc, scratch, cgroup
        self.overhead_mb = overhead_mb
        self.limits = spec.limits
        self.ours = BRIDGE_TASKS if spec.egress else 0  # guest tasks that are not the program's
        self.proc: subprocess.Popen[bytes] | None = None
        self.exited = -1  # a pidfd of runsc while the sandbox is watched
        self.streams: Streams | None = None
        self.forks = ForkWatch(scratch.root / "forks.fifo")
        self.kill_reason: Reason | None = None
        self.launched_at = 0.0
        self.guest_procs_peak = 0
        self.next_pids_confirm = 0.0
        self.pids_confirm_every_s = PIDS_CONFIRM_FIRST_S
        self.cpu_applied = False
        self.detail = ""
        self.usage: dict[str, float] = {}

    def _prepare(self) -> None:
        spec = self.spec
        check_env(spec.env)
        self.scratch.create(spec.code, spec.inputs, self.limits.disk_mb)
        self.scratch.restore_outputs(spec.restore_outputs, GUEST_UID)  # before the program runs
        config = oci_config(spec, self.scratch)
        ensure_guest_package(spec.image.rootfs)
        config["mounts"] += oci_guest_mounts(spec)
        require_mount_points(config, spec.image.rootfs)
        write_config(config, self.scratch.bundle)
        egress = spec.egress is not None
        self.cgroup.create(cgroup_limits(self.limits, self.overhead_mb, egress))

    def _launch(self) -> Streams:
        run = self.runsc.run_argv(
            self.scratch.bundle,
            self.spec.sandbox_id,
            self.scratch.log,
            host_uds=needs_host_sockets(self.spec),
            extra=self.forks.runsc_flags(),
        )
        self.forks.start()
        argv = in_cgroup(self.cgroup, run)  # it never runs outside them
        self.launched_at = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=RUNSC_ENV,
            start_new_session=True,  # the worker's terminal signals are not the sandbox's
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        cap = int(self.limits.output_mb * MiB)
        self.streams = Streams(self.proc.stdout, self.proc.stderr, self.sink, cap)
        self.streams.start()
        return self.streams

    def _limit_crossed(self, streams: Streams) -> Reason | None:
        if self.cancel.is_set():
            return Reason.CANCELLED
        if streams.error is not None:
            return Reason.INTERNAL
        if streams.budget.exceeded.is_set():
            return Reason.OUTPUT_LIMIT
        if self.forks.refused:
            return Reason.PIDS
        now = time.monotonic()
        if (counted := self._cgroup_limit(streams, now)) is not None:
            return counted
        if streams.ready_at is None:
            return Reason.RUNTIME_ERROR if now > self.launched_at + START_TIMEOUT_S else None
        if not self.cpu_applied and not self._apply_tenant_cpu():
            return Reason.RUNTIME_ERROR
        if now > streams.ready_at + self.limits.timeout_s:
            return Reason.TIMEOUT
        return Reason.PIDS if self._guest_over_pids(now) else None

    def _apply_tenant_cpu(self) -> bool:
        """Lower the boot quota to the tenant's; False (fail closed) if that cannot be done."""
        self.cpu_applied = True
        if self.limits.cpu >= BOOT_CPUS:
            return True
        try:
            self.cgroup.set_cpus(self.limits.cpu)
        except OSError as exc:
            self.detail = f"cannot apply the cpu limit: {exc}"
            return False
        return True

    def _guest_over_pids(self, now: float) -> bool:
        """The tripwire: did the guest take the one process slot above its budget?

        Stub processes on the host are a free (and generous) estimate; the sentry's own count,
        via `runsc events`, confirms it before anything is killed.
        """
        guests = self.cgroup.process_count() - RUNSC_HOST_PROCS - self.ours
        self.guest_procs_peak = max(self.guest_procs_peak, guests)
        if guests <= self.limits.pids or now < self.next_pids_confirm:
            return False
        count = self.runsc.process_count(self.spec.sandbox_id)
        if count is not None and count - self.ours > self.limits.pids:
            return True
        # A false alarm (stubs outlive their processes): ask runsc less and less often.
        self.pids_confirm_every_s = min(PIDS_CONFIRM_MAX_S, self.pids_confirm_every_s * 2)
        self.next_pids_confirm = now + self.pids_confirm_every_s
        return False

    def _kill(self) -> None:
        """Kill that really kills: every guest process, then every host process of ours."""
        assert self.proc is not None
        try:
            self.runsc.kill_all(self.spec.sandbox_id)
            self.proc.wait(EXIT_WAIT_S)
        except (RunscError, subprocess.TimeoutExpired):
            pass  # the cgroup sweep below does not depend on runsc cooperating
        self.cgroup.kill_all()

    def _decide(self, streams: Streams, exit_code: int) -> SandboxResult:
        limits = self.limits
        if self.kill_reason is not None:
            return SandboxResult(None, self.kill_reason, self._describe(self.kill_reason))
        if streams.budget.exceeded.is_set():  # cut after the program had already ended
            return SandboxResult(None, Reason.OUTPUT_LIMIT, self._describe(Reason.OUTPUT_LIMIT))
        if self.forks.stop():  # the sandbox has exited: every line it wrote is counted
            return SandboxResult(exit_code, Reason.PIDS, self._describe(Reason.PIDS))
        if self.cgroup.oom_kills():
            return SandboxResult(None, Reason.MEMORY, self._describe(Reason.MEMORY))
        if self.cgroup.pids_limit_hits():
            return SandboxResult(None, Reason.PIDS, self._describe(Reason.PIDS))
        if streams.ready_at is None:
            return SandboxResult(None, Reason.RUNTIME_ERROR, self._start_failure(exit_code))
        if exit_code == 0:
            return SandboxResult(0, None)
        if self.scratch.disk_full():
            return SandboxResult(exit_code, Reason.DISK, f"disk limit of {limits.disk_mb} MB")
        if self.guest_procs_peak > limits.pids:
            return SandboxResult(exit_code, Reason.PIDS, self._describe(Reason.PIDS))
        return SandboxResult(exit_code, Reason.EXIT_CODE, f"exit code {exit_code}")

    def _describe(self, reason: Reason) -> str:
        limits = self.limits
        assert self.streams is not None
        if reason is Reason.CANCELLED:
            return "cancelled"
        if reason is Reason.TIMEOUT:
            return f"wall-clock limit of {limits.timeout_s:g} s"
        if reason is Reason.OUTPUT_LIMIT:
            return f"output limit of {self.streams.budget.cap} bytes"
        if reason is Reason.PIDS:
            return f"process limit of {limits.pids}"
        if reason is Reason.MEMORY:
            return f"memory limit of {limits.memory_mb} MB"
        if reason is Reason.INTERNAL:
            return f"the output sink failed: {self.streams.error!r}"
        return self.detail or f"the sandbox did not start within {START_TIMEOUT_S:g} s"

    def _start_failure(self, exit_code: int) -> str:
        """What runsc said (its stderr), and the end of its log, which names the cause."""
        assert self.streams is not None
        said = self.streams.early_text()
        log = _tail(self.scratch.log, 1000)
        return f"runsc failed to start the sandbox (exit {exit_code}): {said} | runsc log: {log}"

    def _force_kill(self) -> None:
        self.cgroup.kill_all()

    def _release(self) -> list[str]:
        """Remove everything of this sandbox from the host; return what is still there."""
        self.forks.stop()
        problems: list[str] = []
        for step in (self._stop_container, self._empty_cgroup, self.scratch.teardown):
            try:
                problems += step()
            except (OSError, RunscError) as exc:  # keep releasing what can be released
                problems.append(f"{step.__name__}: {exc}")
        if self.runsc.has_state(self.spec.sandbox_id):
            problems.append("runsc container state")
        return problems + left_on_host(self.spec.sandbox_id, self.cgroup)

    def _stop_container(self) -> list[str]:
        if self.proc is not None and self.proc.poll() is None:
            self._kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(EXIT_WAIT_S)  # our direct child: reap it, or it stays a zombie
        if self.runsc.has_state(self.spec.sandbox_id):  # `run` was killed before cleaning up
            self.runsc.delete(self.spec.sandbox_id)
        return []

    def _empty_cgroup(self) -> list[str]:
        if not self.cgroup.kill_all():
            return ["processes left in the cgroup"]
        return [] if self.cgroup.remove() else [f"cgroup {self.cgroup.relpath}"]


def _tail(path: Path, limit: int = 2000) -> str:
    try:
        with path.open("rb") as log:
            return log.read()[-limit:].decode("utf-8", "replace").strip()
    except OSError:
        return ""
