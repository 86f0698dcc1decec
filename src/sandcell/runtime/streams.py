"""Reading a sandbox's stdout and stderr: the ready line, the output budget, runsc's noise.

Both pipes are read in their own thread with `os.read`, so a chunk reaches the sink as soon as
the guest writes it. Until the ready line arrives on stdout, whatever runsc itself prints is
not the tenant's output: it is kept (bounded) for the error detail instead.

A pooled sandbox's runner ends each pipe with an exit line (`\x1esandcell-exit STATUS\n`, see
guest/pool_runner.py) once the job's code is done: with `exit_lines`, each pump cuts its pipe
there and records the status, so the host knows the job's end before gVisor's own teardown.
Whatever follows an exit line is not delivered. A program that prints such a line itself only
ends its own output early, with a status it could have exited with anyway.
"""

import os
import re
import threading
import time
from collections.abc import Callable
from typing import IO

from sandcell.ports.runtime import SandboxSink
from sandcell.runtime.bundle import READY_MARKER

CHUNK = 64 * 1024
EARLY_BYTES = 16 * 1024  # how much pre-ready text (runsc's complaints) is kept for the detail
EXIT_PREFIX = b"\x1esandcell-exit "
EXIT_LINE = re.compile(rb"\x1esandcell-exit (\d{1,3})\n")


class OutputBudget:
    """stdout and stderr share one cap; the chunk that crosses it is cut and marked."""

    def __init__(self, sink: SandboxSink, cap_bytes: int) -> None:
        self.sink = sink
        self.cap = cap_bytes
        self.used = 0
        self.exceeded = threading.Event()
        self._lock = threading.Lock()  # also orders the marker after every delivered byte

    def deliver(self, stream: str, data: bytes) -> None:
        with self._lock:
            if self.exceeded.is_set():
                return  # drained, never delivered
            room = self.cap - self.used
            if len(data) <= room:
                self.used += len(data)
                self.sink.output(stream, data)
                return
            if room > 0:
                self.used += room
                self.sink.output(stream, data[:room])
            self.sink.output(
                stream, f"\n[sandcell: output truncated at {self.cap} bytes]\n".encode()
            )
            self.exceeded.set()


class Streams:
    def __init__(
        self,
        stdout: IO[bytes],
        stderr: IO[bytes],
        sink: SandboxSink,
        cap: int,
        exit_lines: bool = False,
        ready_line: bool = True,
    ) -> None:
        self.sink = sink
        # Without a ready line (a sandbox whose start the runtime tells apart by other means),
        # the program is taken as running from the start, and the head of stderr is kept too:
        # whatever the runtime itself printed there, if the program never ran.
        self._ready_line = ready_line
        self.budget = OutputBudget(sink, cap)
        self.ready_at: float | None = None  # monotonic time the ready line arrived
        self.decided = threading.Event()  # ready, or stdout ended (or lied) without it
        self.early = bytearray()
        self.error: BaseException | None = None  # the first exception the sink raised
        # Per pipe, the status of its exit line once seen (only with `exit_lines`).
        self._exit_lines = {"stdout": ExitLine(), "stderr": ExitLine()} if exit_lines else None
        self._ended_pipes: set[str] = set()  # reached their exit line, or EOF
        self._ended_lock = threading.Lock()
        self.ended = threading.Event()  # both have: the program is done, or gone
        self._threads = [
            threading.Thread(target=self._pump_stdout, args=(stdout,), daemon=True),
            threading.Thread(target=self._pump_stderr, args=(stderr,), daemon=True),
        ]

    @property
    def ready(self) -> bool:
        return self.ready_at is not None

    @property
    def exit_status(self) -> int | None:
        """The status both exit lines gave, once both pipes have delivered theirs."""
        if self._exit_lines is None:
            return None
        out, err = self._exit_lines["stdout"].status, self._exit_lines["stderr"].status
        return out if out is not None and out == err else None

    def start(self) -> None:
        if not self._ready_line:
            self._mark_ready()
        for thread in self._threads:
            thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for both pipes to close; True if they did."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    def early_text(self) -> str:
        return self.early.decode("utf-8", "replace").strip()

    def _pump_stdout(self, pipe: IO[bytes]) -> None:
        fd = pipe.fileno()
        head = b""
        try:
            while not self.decided.is_set():
                chunk = os.read(fd, CHUNK)
                head += chunk
                if not chunk or not READY_MARKER.startswith(head[: len(READY_MARKER)]):
                    self._keep_early(head)  # ended or not the marker: never started
                    self.decided.set()
                    break
                if head.startswith(READY_MARKER):
                    self._mark_ready()
                    self._pipe_data("stdout", head[len(READY_MARKER) :])
            self._drain(fd, "stdout" if self.ready else None)
        finally:
            self.decided.set()
            self._pipe_ended("stdout")
            pipe.close()

    def _pump_stderr(self, pipe: IO[bytes]) -> None:
        fd = pipe.fileno()
        try:
            while chunk := os.read(fd, CHUNK):
                self.decided.wait()  # stdout tells whether this is the guest's or runsc's
                if self.ready:
                    self._pipe_data("stderr", chunk)
                if not self.ready or not self._ready_line:
                    self._keep_early(chunk)
            self._pipe_data("stderr", b"", eof=True)
        finally:
            self._pipe_ended("stderr")
            pipe.close()

    def _mark_ready(self) -> None:
        self.ready_at = time.monotonic()
        self._call(self.sink.ready)
        self.decided.set()  # only now may stderr deliver: `ready` comes before any output

    def _drain(self, fd: int, stream: str | None) -> None:
        while chunk := os.read(fd, CHUNK):
            if stream:
                self._pipe_data(stream, chunk)
        if stream:
            self._pipe_data(stream, b"", eof=True)

    def _pipe_data(self, stream: str, data: bytes, eof: bool = False) -> None:
        """The program's bytes from one pipe; up to its exit line, if this run has them."""
        if self._exit_lines is None:
            self._deliver(stream, data)
            return
        line = self._exit_lines[stream]
        was_open = line.status is None
        self._deliver(stream, line.feed(data, eof))
        if was_open and line.status is not None:
            self._pipe_ended(stream)  # the rest of this pipe is not the program's

    def _pipe_ended(self, stream: str) -> None:
        with self._ended_lock:
            self._ended_pipes.add(stream)
            if len(self._ended_pipes) == 2:
                self.ended.set()

    def _deliver(self, stream: str, data: bytes) -> None:
        if data and self.error is None:
            self._call(self.budget.deliver, stream, data)

    def _call(self, fn: Callable[..., object], *args: object) -> None:
        try:
            fn(*args)
        except Exception as exc:  # the worker's sink failed: the runtime ends the run
            if self.error is None:
                self.error = exc

    def _keep_early(self, data: bytes) -> None:
        room = EARLY_BYTES - len(self.early)
        if room > 0:
            self.early += data[:room]


class ExitLine:
    """Finds the runner's exit line in one pipe; holds back a tail that may be its start."""

    def __init__(self) -> None:
        self.status: int | None = None
        self._held = b""

    def feed(self, data: bytes, eof: bool = False) -> bytes:
        """What of `data` (after what was held back) is the program's to deliver now."""
        if self.status is not None:
            return b""
        data, self._held = self._held + data, b""
        found = EXIT_LINE.search(data)
        if found:
            self.status = int(found.group(1))
            return data[: found.start()]
        if eof:
            return data
        start = data.rfind(EXIT_PREFIX[:1], max(0, len(data) - len(EXIT_PREFIX) - 4))
        if start >= 0 and _could_become_exit_line(data[start:]):
            data, self._held = data[:start], data[start:]
        return data


def _could_become_exit_line(tail: bytes) -> bool:
    if len(tail) <= len(EXIT_PREFIX):
        return EXIT_PREFIX.startswith(tail)
    return tail.startswith(EXIT_PREFIX) and tail[len(EXIT_PREFIX) :].isdigit()
