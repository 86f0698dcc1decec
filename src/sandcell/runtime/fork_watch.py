"""Refused forks, as the sentry saw them: the exact sign that the guest hit its process cap.

runsc's strace, limited to the fork family, writes one line per call to a FIFO read here; a
fork that failed with EAGAIN is RLIMIT_NPROC (the guest's pids budget) saying no. Sampling
process counts from the host misses a fork bomb that dies on its first EAGAIN within a tick or
two; this does not. A FIFO rather than a file: a program that forks in a loop cannot fill the
host's disk with log lines, and only the lines that matter are kept (as a count).
"""

import contextlib
import fcntl
import os
import re
import select
import threading
from pathlib import Path

TRACED = "clone,fork,vfork"
# `[  10:  10] python3.11 X clone(…) = 0 (0x0) errno=11 (try again) (601µs)`: the exit line.
REFUSED = re.compile(rb" X (?:clone|fork|vfork)\(.*\) = .* errno=11 \(")
CHUNK = 65536
GATHER_S = 0.05  # < the watch's tick (one_shot.TICK_S)
PIPE_BYTES = 1 << 20  # what runsc may write while lines gather, before its writes block


class ForkWatch:
    def __init__(self, fifo: Path) -> None:
        self.fifo = fifo
        self.refused = 0
        self._fd: int | None = None
        self._stop = threading.Event()
        self._wake_r, self._wake_w = -1, -1  # stop() writes here so the poll returns at once
        self._thread = threading.Thread(target=self._read, name="fork-watch", daemon=True)

    def runsc_flags(self) -> list[str]:
        """Global runsc flags that send the sandbox's (boot's) strace of forks to the FIFO."""
        return [
            "--strace",
            f"--strace-syscalls={TRACED}",
            f"--debug-log={self.fifo}",
            "--debug-command=boot",
        ]

    def start(self) -> None:
        os.mkfifo(self.fifo, 0o600)
        # Read and write: runsc's open never blocks, and its exit never reads as our EOF.
        self._fd = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)
        with contextlib.suppress(OSError):  # a bigger buffer only spares runsc a short wait
            fcntl.fcntl(self._fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        self._wake_r, self._wake_w = os.pipe()
        self._thread.start()

    def stop(self) -> int:
        """Read what is left (the sandbox has exited), stop, and return the refused count."""
        if self._fd is None:
            return self.refused
        self._stop.set()
        os.write(self._wake_w, b"x")
        self._thread.join()
        for fd in (self._fd, self._wake_r, self._wake_w):
            os.close(fd)
        self._fd = None
        return self.refused

    def _read(self) -> None:
        assert self._fd is not None
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        partial = b""
        while True:
            stopping = self._stop.is_set()  # looked at before the last read: nothing is missed
            # Blocks until runsc writes or stop() writes to the wake pipe: a timeout would only
            # wake this thread (one per running sandbox) for nothing.
            events = poller.poll(0 if stopping else None)
            if any(fd == self._fd for fd, _ in events):
                if not stopping:
                    # runsc writes its boot log a line at a time (~50 writes): let them gather
                    # and read them in one wake-up. The watch looks at `refused` once a tick.
                    self._stop.wait(GATHER_S)
                data = self._drain()
                *lines, partial = (partial + data).split(b"\n")
                self.refused += sum(1 for line in lines if REFUSED.search(line))
                partial = partial[-CHUNK:]  # a line is never that long; keep memory bounded
                if data:
                    continue
            if stopping:
                return

    def _drain(self) -> bytes:
        """Everything the FIFO holds now."""
        assert self._fd is not None
        chunks = []
        while True:
            try:
                chunk = os.read(self._fd, CHUNK)
            except BlockingIOError:
                break
            chunks.append(chunk)
        return b"".join(chunks)
