"""The kernel's sys.stdout and sys.stderr: what a cell prints, written to fds 1 and 2 in batches.

Under gVisor a write costs ~70 us, and `python -u` made two of every print: a cell printing
10,000 lines took 3 s, nearly all of it in writes. Here a print only appends to memory. The
text goes to its fd (the pipe the output pump reads, see wire.py) in one write:

- FLUSH_S after the first text not yet written (a flusher thread), so output still streams;
- once BATCH_BYTES are waiting;
- on `flush()`: the kernel's at a cell's end and before each display, and the user's own;
- before a child process starts (an audit hook): the child writes to the same pipe, and must
  find there what the cell printed before it.

Jupyter's kernel batches its streams the same way (every 0.2 s).
"""

import contextlib
import io
import os
import sys
import threading
import time
from typing import Any

from .wire import write_all

FLUSH_S = 0.05
BATCH_BYTES = 1 << 16
# Audit events raised just before a new process starts (os.system's and IPython's `!` too).
CHILD_EVENTS = frozenset(
    {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn"}
    | {"os.fork", "os.forkpty"}
)


class BatchedStream(io.TextIOBase):
    """A text stream to `fd` that writes what it is given in batches (see the module's doc)."""

    def __init__(self, fd: int, name: str, encoding: str, errors: str, wake: threading.Event):
        self.fd, self.name, self._wake = fd, name, wake
        self._encoding, self._errors = encoding, errors
        self._parts: list[bytes] = []
        self._size = 0
        self._lock = threading.Lock()
        self.write_through = self.line_buffering = False  # each text at once if either
        self.buffer = _Bytes(self)

    @property
    def encoding(self) -> str:  # type: ignore[override]  # io.TextIOBase's is read-only too
        return self._encoding

    @property
    def errors(self) -> str:  # type: ignore[override]
        return self._errors

    def fileno(self) -> int:
        return self.fd

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.append(text.encode(self._encoding, self._errors))
        return len(text)

    def append(self, data: bytes) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        with self._lock:
            first = not self._parts
            self._parts.append(data)
            self._size += len(data)
            if self.write_through or self.line_buffering or self._size >= BATCH_BYTES:
                self._write_out()
            elif first:
                self._wake.set()

    def flush(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        with self._lock:
            self._write_out()

    def reconfigure(self, **options: Any) -> None:
        """What code written for a real stdout asks of it: encoding, errors, line buffering."""
        self.flush()
        self._encoding = options.get("encoding") or self._encoding
        self._errors = options.get("errors") or self._errors
        for option in ("line_buffering", "write_through"):
            if options.get(option) is not None:
                setattr(self, option, bool(options[option]))

    def unbatch(self) -> None:
        """Write each text at once from now on, dropping what is queued (a forked child's)."""
        self._lock = threading.Lock()
        self._parts.clear()
        self._size = 0
        self.write_through = True

    def _write_out(self) -> None:
        if not self._parts:
            return
        data = b"".join(self._parts)
        self._parts.clear()
        self._size = 0
        write_all(self.fd, data)


class _Bytes:
    """`sys.stdout.buffer`: bytes written in order with the text."""

    def __init__(self, stream: BatchedStream) -> None:
        self.stream = stream

    def write(self, data: bytes) -> int:
        self.stream.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fd

    def writable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return self.stream.closed


def install() -> list[BatchedStream]:
    """Make sys.stdout and sys.stderr batched streams on fds 1 and 2; start their flusher."""
    return Batching().streams


class Batching:
    """The two streams, their flusher thread, and the hooks that flush them before a child
    process starts and unbatch them in a forked child."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.streams = []
        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            old.flush()
            stream = BatchedStream(fd, f"<{name}>", old.encoding, old.errors, self.wake)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)
            self.streams.append(stream)
        sys.addaudithook(self.before_children)
        os.register_at_fork(after_in_child=self.in_a_forked_child)
        threading.Thread(target=self.flusher, name="std-flusher", daemon=True).start()

    def flush_all(self) -> None:
        for stream in self.streams:
            with contextlib.suppress(OSError, ValueError):  # the cell closed the fd or stream
                stream.flush()

    def before_children(self, event: str, args: tuple[Any, ...]) -> None:
        if event in CHILD_EVENTS:
            self.flush_all()

    def flusher(self) -> None:
        while True:
            self.wake.wait()
            self.wake.clear()
            time.sleep(FLUSH_S)
            self.flush_all()

    def in_a_forked_child(self) -> None:
        # The flusher is not there, and another thread may have held a lock at the fork: the
        # child writes each text at once, as `python -u` does; what the parent still had
        # queued is the parent's to write.
        for stream in self.streams:
            stream.unbatch()
