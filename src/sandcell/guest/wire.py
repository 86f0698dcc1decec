"""The kernel's wires: JSON lines to and from the host, and the capture of fds 1 and 2.

The host speaks to the kernel over the sandbox's stdin and stdout. Both are moved to private
file descriptors at start, and fds 1 and 2 become pipes this module reads: whatever anything in
the sandbox writes there (print, os.system, a subprocess) is output of the running cell and can
never be taken for a protocol line.
"""

import codecs
import fcntl
import json
import os
import queue
import select
import struct
import termios
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

Message = dict[str, Any]
OutputSink = Callable[[str, str], None]  # (stream name, text)
CHUNK = 65536
OUTBOX_LINES = 256  # a host that stops reading slows the kernel down instead of growing it


class Channel:
    """Requests in, messages out; one writer at a time keeps every line whole, in order.

    Writers only ever enqueue: a KeyboardInterrupt can land in the main thread at any bytecode,
    and must never leave half a line on the wire. `send_idle` is the one exception, for the
    main thread between cells (where SIGINT is ignored): a cell's answer written by the thread
    that has it, not handed to the writer thread first, a wake-up (~50 us in gVisor) saved on
    every cell's round trip.
    """

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.reader = os.fdopen(read_fd, "rb", buffering=CHUNK)
        self.write_fd = write_fd
        self.outbox: queue.Queue[bytes | None] = queue.Queue(maxsize=OUTBOX_LINES)
        self._writing = threading.Lock()  # held for each whole line written
        self.writer = threading.Thread(target=self._write_loop, name="wire-out", daemon=True)
        self.writer.start()

    def send(self, message: Message) -> None:
        self.outbox.put(_line(message))

    def send_idle(self, message: Message) -> None:
        """Write `message` from this thread if every line queued before it is written;
        otherwise queue it behind them. Only where no KeyboardInterrupt can land."""
        with self._writing:
            # Each queued line counts as unfinished until the writer has written it (task_done
            # under this lock): none left means none can still come out after this one.
            if self.outbox.unfinished_tasks == 0:
                self._write(_line(message))
                return
        self.send(message)

    def requests(self) -> Iterator[Message]:
        """Each well-formed request; ends when the host closes the wire."""
        for line in self.reader:
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if isinstance(message, dict):
                yield message

    def close(self, timeout_s: float = 5.0) -> None:
        """Send everything queued, then stop the writer."""
        self.outbox.put(None)
        self.writer.join(timeout_s)

    def _write_loop(self) -> None:
        while (data := self.outbox.get()) is not None:
            with self._writing:
                self._write(data)
                self.outbox.task_done()
        self.outbox.task_done()  # the stop too: nothing queued is left unwritten

    def _write(self, data: bytes) -> None:
        try:
            write_all(self.write_fd, data)
        except OSError:
            os._exit(0)  # the host is gone: nobody is left to serve


def write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is written (a pipe takes a large write in parts)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _line(message: Message) -> bytes:
    # ASCII only: lone surrogates and odd bytes from user output cannot break the encoding.
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


class OutputPump:
    """Reads one of fds 1/2 (through its pipe) and hands the text to `sink`.

    A read is marked in flight, under `handed_on`, from before it leaves the pipe until its
    sink returns, and each one wakes the waiters: so `drain` can tell "the pipe is empty and
    every byte read from it was handed on" from "a read is in flight", and learns of each read
    at once (a poll would add its period to every cell that prints). The lock is held only to
    flip that mark, never across a read or a sink: when the pump held it for the whole read,
    a pump that kept finding output took it straight back after every read, and a drain could
    not get it back to give up at its timeout.
    """

    def __init__(self, name: str, read_fd: int, sink: OutputSink) -> None:
        self.name, self.fd, self.sink = name, read_fd, sink
        self.handed_on = threading.Condition(threading.Lock())
        self.in_flight = False  # a read taken from the pipe and not yet handed on
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        os.set_blocking(read_fd, False)
        threading.Thread(target=self._loop, name=f"pump-{name}", daemon=True).start()

    def drain(self, timeout_s: float) -> bool:
        """Wait until everything written so far went to the sink; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self.handed_on:
            while self.in_flight or pending_bytes(self.fd):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.handed_on.wait(left)
            return True

    def _loop(self) -> None:
        data: bytes | None = None
        while data != b"":  # b"": every write end is closed (the user closed fd 1)
            select.select([self.fd], [], [])
            with self.handed_on:
                self.in_flight = True
            try:
                data = os.read(self.fd, CHUNK)
                text = self.decoder.decode(data)
                if text:
                    self.sink(self.name, text)
            except BlockingIOError:
                data = None
            finally:
                with self.handed_on:
                    self.in_flight = False
                    self.handed_on.notify_all()


def capture(fd: int) -> int:
    """Point `fd` at a new pipe; return the pipe's read end."""
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)  # dup2 makes `fd` inheritable: children write to the pipe too
    os.close(write_end)
    return read_end


def pending_bytes(fd: int) -> int:
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
