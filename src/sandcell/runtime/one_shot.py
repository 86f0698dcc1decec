"""What every one-shot sandbox run shares, whatever isolates it (runsc or bwrap).

The steps are the same: prepare, launch, watch the limits, wait for the exit, decide the
reason, collect /output, release and verify. Subclasses supply the runtime-specific steps.
"""

import os
import subprocess
import time
from abc import ABC, abstractmethod

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import EarlySink, SandboxResult, SandboxSink, SandboxSpec
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.ext4 import ScratchError
from sandcell.runtime.outputs import collect_outputs
from sandcell.runtime.readable import readable
from sandcell.runtime.scratch import Scratch
from sandcell.runtime.streams import Streams

EXIT_WAIT_S = 5.0
# How often the watch looks at the limits and `cancel`. The ready line ends a wait at once (the
# program's own CPU quota applies then), and so does the exit. A look costs CPU for as long as
# the job starts and runs, and on a busy host (16 jobs on 2 cores) that is seconds: polled every
# 20 ms, the watch's CPU grew with the load.
TICK_S = 0.1
# While the sandbox boots, how often the watch reads its cgroup's counters (_cgroup_limit).
BOOT_LOOK_S = 1.0


class OneShotRun(ABC):
    spec: SandboxSpec
    limits: Limits
    sink: SandboxSink
    scratch: Scratch
    cgroup: SandboxCgroup
    proc: subprocess.Popen[bytes] | None
    streams: Streams | None
    launched_at: float
    next_boot_look: float = 0.0  # when the watch next reads the cgroup while booting
    started: float
    usage: dict[str, float]
    kill_reason: Reason | None
    exited: int  # a pidfd of the launched process while the sandbox is watched

    def execute(self) -> SandboxResult:
        self.started = time.monotonic()
        try:
            result = self._run()
        finally:
            self._before_release()
            problems = self._release()
        result.released = not problems
        if problems:
            result.detail = "; ".join([result.detail, "not released: " + ", ".join(problems)])
        if not result.usage:  # else it was reported early, usage and all: keep it the same
            result.usage = self._usage_now()
        if self.streams is not None and self.streams.error is not None:
            raise self.streams.error  # the sink's own failure is the caller's to handle
        return result

    def _run(self) -> SandboxResult:
        try:
            self._prepare()
            streams = self._launch()
        except (OSError, ScratchError, ValueError, RuntimeUnavailable) as exc:
            return SandboxResult(None, Reason.RUNTIME_ERROR, f"cannot start the sandbox: {exc}")
        self._watch(streams)
        early = self._early_result(streams)
        exit_code = self._wait_exit(streams)
        if early is not None:
            return early
        result = self._decide(streams, exit_code)
        self._collect(streams)
        self._end_early(streams, result)
        return result

    def _watch(self, streams: Streams) -> None:
        """Until the sandbox exits (or its program is done), look at the limits; kill the
        sandbox when one is crossed, and keep the reason."""
        assert self.proc is not None
        self.exited = os.pidfd_open(self.proc.pid)
        try:
            while self.proc.poll() is None:
                reason = self._limit_crossed(streams)
                if reason is not None:
                    self.kill_reason = reason
                    self._kill()
                    return
                if self._program_done(streams):
                    return
                self._tick(streams)
        finally:
            os.close(self.exited)

    def _program_done(self, streams: Streams) -> bool:
        """Whether the program has ended while its sandbox still runs (a warm one's runner
        says so); for a one-shot sandbox only the exit tells."""
        return False

    def _tick(self, streams: Streams) -> None:
        # Waiting on a pidfd, not sleeping: the exit is seen at once, not up to a tick late,
        # and without `Popen.wait`'s polls (a waitpid and a sleep every few ms).
        if not self._waited_for_start(streams):
            readable(self.exited, self._wait_s(streams))

    def _early_result(self, streams: Streams) -> SandboxResult | None:
        """A run that knows its program's end before the sandbox exits reports it here (and
        returns it); see ports.runtime.EarlySink."""
        return None

    def _end_early(self, streams: Streams, result: SandboxResult) -> bool:
        """Hand a clean end (decided, outputs collected) to an EarlySink before the release:
        removing the sandbox from the host (its cgroup, its scratch disk, the checks that
        nothing is left; 10-30 ms) need not hold up the job's caller. A limit's end, or a
        sink that failed, waits for the release."""
        if result.reason not in (None, Reason.EXIT_CODE) or streams.error is not None:
            return False
        if not isinstance(self.sink, EarlySink):
            return False
        result.usage = self._usage_now()
        self.sink.ended(result)
        return True

    def _before_release(self) -> None:
        """A step of the run's own before the sandbox is released (a warm runner's exit)."""
        return None

    def _wait_s(self, streams: Streams) -> float:
        """How long the watch may wait before it looks again: never past the job's timeout."""
        if streams.ready_at is None:
            return TICK_S
        left = streams.ready_at + self.limits.timeout_s - time.monotonic()
        return max(0.0, min(TICK_S, left))

    def _waited_for_start(self, streams: Streams) -> bool:
        """While the program starts, wait for its ready line (or for stdout to end, as when it
        never starts) rather than for the exit; False once that is decided."""
        if streams.decided.is_set():
            return False
        streams.decided.wait(self._wait_s(streams))
        return True

    def _cgroup_limit(self, streams: Streams, now: float) -> Reason | None:
        """A limit the cgroup's counters show crossed: an OOM kill, the host task cap.

        Read every tick once the program runs; while the sandbox boots, every BOOT_LOOK_S. An
        OOM kill or the task cap during the boot ends the sandbox by itself, and `_decide`
        reads the counters after the exit, so the reason is the same; only a boot that hangs
        after one is seen later. Under load a boot lasts seconds (16 sandboxes on 2 cores),
        and two reads every tick of it were CPU spent on every job for nothing.
        """
        if streams.ready_at is None:
            if now < self.next_boot_look:
                return None
            self.next_boot_look = now + BOOT_LOOK_S
        if self.cgroup.oom_kills():
            return Reason.MEMORY
        if self.cgroup.pids_limit_hits():
            return Reason.PIDS
        return None

    def _usage_now(self) -> dict[str, float]:
        return self.usage | {"wall_s": round(time.monotonic() - self.started, 3)}

    def _wait_exit(self, streams: Streams) -> int:
        assert self.proc is not None
        try:
            self.proc.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self._force_kill()
            self.proc.wait(EXIT_WAIT_S)
        if not streams.join(EXIT_WAIT_S):  # a process of the sandbox still holds a pipe open
            self._force_kill()
            streams.join(EXIT_WAIT_S)
        self._take_usage(streams)
        code = self.proc.returncode
        return 128 - code if code < 0 else code  # the launcher killed by signal n: 128+n

    def _take_usage(self, streams: Streams) -> None:
        self.usage.update(self.cgroup.usage())
        self.usage["output_bytes"] = streams.budget.used
        if streams.ready_at is not None:
            self.usage["start_s"] = round(streams.ready_at - self.launched_at, 3)

    def _collect(self, streams: Streams) -> None:
        if streams.error is not None or not self.scratch.is_mounted():
            return
        collected = collect_outputs(self.scratch.output, self.sink)
        self.usage["output_files"] = collected.files
        self.usage["skipped_outputs"] = collected.skipped
        self.usage["disk_bytes"] = self.scratch.used_bytes()

    @abstractmethod
    def _prepare(self) -> None: ...

    @abstractmethod
    def _launch(self) -> Streams: ...

    @abstractmethod
    def _limit_crossed(self, streams: Streams) -> Reason | None:
        """The limit the sandbox has crossed (or cancel, or a failed start), if any."""

    @abstractmethod
    def _kill(self) -> object:
        """Kill the sandbox for the reason in `kill_reason`."""

    @abstractmethod
    def _decide(self, streams: Streams, exit_code: int) -> SandboxResult: ...

    @abstractmethod
    def _force_kill(self) -> None:
        """Kill every process of the sandbox, now."""

    @abstractmethod
    def _release(self) -> list[str]:
        """Remove everything of this sandbox from the host; return what is still there."""
