"""A warm sandbox and the hand-over of one job to it, whatever isolates it (runsc or bwrap).

A warm sandbox is a job sandbox booted before its job exists, whose program is the guest pool
runner (sandcell.guest.pool_runner): it imports the image's heavy modules, says so with one
line, and waits for one job on its stdin. At hand-over (HandOverRun) the host writes the code
to /job/main.py, copies the inputs into /input and links the job's guest channel socket into
the channel directory (all three are bind mounts, so files added now are seen inside), then
writes the job (argv, env, and a small job's source too) to the runner's stdin. The runner
prints the ready line and runs the code; from there on it is a one-shot run: the same limit
watching, reasons, output collection and verified release. When the code is done, the runner
says so with its exit lines (streams.py) and waits for its stdin to close: the host decides
and reports the job's end first, then lets the runner exit and the sandbox be torn down.
"""

import contextlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import GUEST_CHANNEL_SOCKET, EarlySink, SandboxResult
from sandcell.ports.sessions import GUEST_PACKAGE_DIR
from sandcell.runtime.bundle import check_env
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.fork_watch import ForkWatch
from sandcell.runtime.one_shot import EXIT_WAIT_S, OneShotRun
from sandcell.runtime.readable import readable
from sandcell.runtime.reap import waited
from sandcell.runtime.scratch import Scratch
from sandcell.runtime.streams import Streams

log = logging.getLogger("sandcell.runtime.pool")
MiB = 1024 * 1024
WARM_MARKER = b"\x1esandcell-warm "  # the runner's line once its imports are done
WARM_TIMEOUT_S = 60.0  # the sandbox's boot plus the image's imports (pandas: ~2 s alone)
MAX_WARM_LINE = 4096
# A job's source up to this size also travels in its hand-over line: the runner then compiles
# it without opening /job/main.py through gVisor's gofer (~0.5 ms). Larger ones are read from
# the file; the runner's line limit (1 MiB) stays well clear.
SOURCE_IN_LINE_MAX = 64 * 1024
WARM_SHARES, JOB_SHARES, TEARDOWN_SHARES = 128, 1024, 2  # cpu.shares (2: the kernel's least)
GUEST_PARENT, GUEST_NAME = str(Path(GUEST_PACKAGE_DIR).parent), Path(GUEST_PACKAGE_DIR).name
RUNNER_BOOT = (
    f"import sys; sys.path.insert(0, {GUEST_PARENT!r}); "
    f"from {GUEST_NAME}.pool_runner import main; main()"
)
# The runner's own environment until the job's replaces it. matplotlib reads its backend and
# config dir at import: headless Agg, and a cache in the sandbox's /tmp (its own memory).
RUNNER_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/workspace",
    "MPLBACKEND": "Agg",
    "MPLCONFIGDIR": "/tmp/.matplotlib",
}


@dataclass
class WarmSandbox:
    sandbox_id: str
    image: Image
    profile: Limits
    scratch: Scratch
    cgroup: SandboxCgroup
    memory_mb_extra: int  # what the cgroup gets on top of the profile's memory for the imports
    proc: subprocess.Popen[bytes] | None = None
    warm_at: float = 0.0  # monotonic; when the runner said its imports were done
    failed_imports: tuple[str, ...] = ()
    forks: ForkWatch | None = None  # gVisor: started with the sandbox; the job's run reads it
    uid: int | None = None  # bwrap: the host uid the sandbox runs as

    @property
    def channel(self) -> Path:
        # On the scratch's tmpfs, where the worker makes the job's socket (app.guest_channels):
        # it is hard-linked in here, which only works within one filesystem.
        return self.scratch.root / "channel"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def memory_bytes(self) -> int:
        """What the sandbox holds now, less reclaimable file cache."""
        stat = self.cgroup.memory_stat()
        return max(0, stat["usage"] - stat.get("total_inactive_file", 0))

    def runner_argv(self, preload: tuple[str, ...]) -> list[str]:
        return [self.image.python, "-c", RUNNER_BOOT, *preload]


def await_warm(warm: WarmSandbox) -> None:
    """Until the runner says its imports are done; RuntimeUnavailable if it never does."""
    assert warm.proc is not None and warm.proc.stdout is not None
    line = read_line(warm.proc.stdout.fileno(), WARM_TIMEOUT_S)
    if not line.startswith(WARM_MARKER):
        said = available_stderr(warm.proc)
        raise RuntimeUnavailable(f"the pool runner did not come up: {said!r} {line[:200]!r}")
    try:
        failed = json.loads(line[len(WARM_MARKER) :]).get("failed", [])
    except (ValueError, AttributeError):
        failed = []
    warm.failed_imports = tuple(str(name) for name in failed)
    if warm.failed_imports:
        log.warning("pool runner of %s could not import %s", warm.image.name, failed)
    warm.warm_at = time.monotonic()


def read_line(fd: int, timeout_s: float) -> bytes:
    """Bytes from `fd` up to a newline (never past it), EOF, MAX_WARM_LINE or the timeout."""
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n") and len(line) < MAX_WARM_LINE:
        if not readable(fd, deadline - time.monotonic()):
            break
        byte = os.read(fd, 1)  # one at a time: nothing after the line is ours to take
        if not byte:
            break
        line += byte
    return line


def available_stderr(proc: subprocess.Popen[bytes]) -> str:
    """What the sandbox said on stderr so far (without blocking), for the error detail."""
    if proc.stderr is None:
        return ""
    fd = proc.stderr.fileno()
    return os.read(fd, 2000).decode("utf-8", "replace").strip() if readable(fd, 0) else ""


def stop_runner(
    warm: WarmSandbox, proc: subprocess.Popen[bytes], ask_to_exit: Callable[[], None] | None = None
) -> None:
    """End a warm sandbox's runner: EOF for an idle one; then the runtime's own kill
    (`ask_to_exit`, if it has one), then its cgroup's, each only if the last did not do."""
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()  # an idle runner exits on EOF
    if not waited(proc, 0.5):
        if ask_to_exit is not None:
            ask_to_exit()
        if ask_to_exit is None or not waited(proc, EXIT_WAIT_S):
            warm.cgroup.kill_all()
            waited(proc, EXIT_WAIT_S)
    close_output_pipes(proc)


def close_output_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


class HandOverRun(OneShotRun):
    """One job in a warm sandbox: hand-over instead of launch; listed before the runtime's
    own run class (`class PooledRun(HandOverRun, SandboxRun)`), whose steps it completes."""

    warm: WarmSandbox
    cpu_before: float = 0.0

    def _prepare(self) -> None:
        # The runner is this run's from here: a hand-over that fails still ends it with the
        # sandbox (its stdin closed, then killed), or it would wait for a job forever.
        self.proc = self.warm.proc
        spec = self.spec
        check_env(spec.env)
        self.scratch.fill(spec.code, spec.inputs)
        if spec.guest_channel is not None:
            os.link(
                spec.guest_channel / GUEST_CHANNEL_SOCKET, self.warm.channel / GUEST_CHANNEL_SOCKET
            )
        self.cpu_before = self.cgroup.usage().get("cpu_s", 0.0)

    def _launch(self) -> Streams:
        proc = self.warm.proc
        assert proc is not None and proc.stdin is not None
        assert proc.stdout is not None and proc.stderr is not None
        self.proc = proc
        self.launched_at = time.monotonic()
        job = {"argv": self.spec.argv, "env": self.spec.env, "cwd": "/workspace"}
        code = self.spec.code
        if code is not None and len(code) <= SOURCE_IN_LINE_MAX:
            job["source"] = code.decode("utf-8", "surrogateescape")  # the same bytes as the file
        proc.stdin.write(json.dumps(job).encode() + b"\n")
        # Kept open: the runner exits when it closes, once the job's result is taken.
        proc.stdin.flush()  # BrokenPipeError (an OSError) if the runner is gone
        cap = int(self.limits.output_mb * MiB)
        self.streams = Streams(proc.stdout, proc.stderr, self.sink, cap, exit_lines=True)
        self.streams.start()
        return self.streams

    def _program_done(self, streams: Streams) -> bool:
        return streams.exit_status is not None

    def _wait_exit(self, streams: Streams) -> int:
        """The job's exit status: the one the runner's exit lines gave, if they came (a job
        that printed the line and goes on is killed after EXIT_WAIT_S: not its own status)."""
        self._let_runner_exit()
        code = super()._wait_exit(streams)
        said = streams.exit_status
        return code if said is None else said

    def _before_release(self) -> None:
        self._let_runner_exit()
        if self.streams is None and self.proc is not None:  # a hand-over that failed:
            close_output_pipes(self.proc)  # no Streams took them

    def _let_runner_exit(self) -> None:
        """Close the runner's stdin: having said the job's end, it waits for this to exit.

        The sandbox's teardown (gVisor's: some 10 ms of CPU on the host) then runs at the
        lowest weight, after the service's own work (answering for the job just reported).
        """
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.cgroup.set_shares(TEARDOWN_SHARES)
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    def _tick(self, streams: Streams) -> None:
        if streams.ended.is_set():  # both pipes closed without exit lines: only the exit tells
            super()._tick(streams)
        elif not self._waited_for_start(streams):
            streams.ended.wait(self._wait_s(streams))  # the runner's exit lines end it at once

    def _early_result(self, streams: Streams) -> SandboxResult | None:
        """The job's end as the runner's exit lines tell it, reported before the teardown.

        Decided as after the exit: every limit's counter can be read while the sandbox lives,
        and what the job wrote to /output is on the host already (a bind mount; under gVisor
        its files are written through, mapped files too). Only a clean end is reported early,
        so a limit's reason is still recorded with the release verified.
        """
        status = streams.exit_status
        if status is None or self.kill_reason is not None or not isinstance(self.sink, EarlySink):
            return None
        result = self._decide(streams, status)
        if result.reason not in (None, Reason.EXIT_CODE):
            return None
        self._take_usage(streams)
        self._collect(streams)
        # The sink may fail while collecting: then the ordinary end reports it.
        return result if self._end_early(streams, result) else None

    def _end_early(self, streams: Streams, result: SandboxResult) -> bool:
        result.pooled = True  # what the early record says; PooledRuntime marks the final one
        return super()._end_early(streams, result)

    def _take_usage(self, streams: Streams) -> None:
        super()._take_usage(streams)
        if "cpu_s" in self.usage:  # the job's CPU, not the boot's and the imports'
            self.usage["cpu_s"] = round(max(0.0, self.usage["cpu_s"] - self.cpu_before), 6)
