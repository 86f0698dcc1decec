"""Reading a sandbox's stdout and stderr: the ready line, the output budget, runsc's noise.

Both pipes are read in their own thread with `os.read`, so a chunk reaches the sink as soon as
the guest writes it. Until the ready line arrives on stdout, whatever runsc itself prints is
not the tenant's output: it is kept (bounded) for the error detail instead.
"""

import os
import threading
import time
from collections.abc import Callable
from typing import IO

from sandcell.ports.runtime import SandboxSink
from sandcell.runtime.bundle import READY_MARKER

CHUNK = 64 * 1024
EARLY_BYTES = 16 * 1024  # how much pre-ready text (runsc's complaints) is kept for the detail


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
    def __init__(self, stdout: IO[bytes], stderr: IO[bytes], sink: SandboxSink, cap: int) -> None:
        self.sink = sink
        self.budget = OutputBudget(sink, cap)
        self.ready_at: float | None = None  # monotonic time the ready line arrived
        self.decided = threading.Event()  # ready, or stdout ended (or lied) without it
        self.early = bytearray()
        self.error: BaseException | None = None  # the first exception the sink raised
        self._threads = [
            threading.Thread(target=self._pump_stdout, args=(stdout,), daemon=True),
            threading.Thread(target=self._pump_stderr, args=(stderr,), daemon=True),
        ]

    @property
    def ready(self) -> bool:
        return self.ready_at is not None

    def start(self) -> None:
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
                    self._deliver("stdout", head[len(READY_MARKER) :])
            self._drain(fd, "stdout" if self.ready else None)
        finally:
            self.decided.set()
            pipe.close()

    def _pump_stderr(self, pipe: IO[bytes]) -> None:
        fd = pipe.fileno()
        try:
            while chunk := os.read(fd, CHUNK):
                self.decided.wait()  # stdout tells whether this is the guest's or runsc's
                if self.ready:
                    self._deliver("stderr", chunk)
                else:
                    self._keep_early(chunk)
        finally:
            pipe.close()

    def _mark_ready(self) -> None:
        self.ready_at = time.monotonic()
        self._call(self.sink.ready)
        self.decided.set()  # only now may stderr deliver: `ready` comes before any output

    def _drain(self, fd: int, stream: str | None) -> None:
        while chunk := os.read(fd, CHUNK):
            if stream:
                self._deliver(stream, chunk)

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
