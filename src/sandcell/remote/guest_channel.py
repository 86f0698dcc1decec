"""The guest channel: a unix socket, bound to one job attempt, for commit_stage and once.

Only the sandbox of that attempt has the socket mounted, so whoever connects is that job; the
requests it can make are the StageRecorder's, nothing else (no API, no other job's ids).

Wire format: one JSON line per request; a commit_stage line lists files with sizes, and exactly
that many bytes of each file follow. One JSON line answers. A request with any field its op
does not define (a job id, a token, a tenant) is refused whole: nothing in a request can point
the channel at anything but its own attempt.
"""

import contextlib
import json
import logging
import os
import secrets
import select
import shutil
import socket
import threading
from pathlib import Path
from typing import Any, BinaryIO

from sandcell.domain.errors import SandcellError
from sandcell.ports.runtime import GUEST_CHANNEL_SOCKET
from sandcell.services.stages import StageRecorder

log = logging.getLogger("sandcell.guest_channel")
MAX_LINE = 64 * 1024
MAX_FILE = 8 * 1024**3
SUN_PATH_MAX = 107  # sockaddr_un.sun_path is 108 bytes, one of them the terminating NUL
DIR_NAME_BYTES = 8  # 64 random bits, in 16 characters of the ~107
FIELDS = {  # every field each op may carry; anything else refuses the request
    "commit_stage": {"op", "name", "files"},
    "once": {"op", "key"},
    "completed_stages": {"op"},
}
FILE_FIELDS = {"path", "size"}


class _Exactly:
    """A read-only stream of exactly `size` bytes of a socket file, for the blob store."""

    def __init__(self, source: BinaryIO, size: int) -> None:
        self.source, self.left = source, size

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        chunk = self.source.read(self.left if n < 0 else min(n, self.left))
        if not chunk:
            raise ConnectionError("the guest closed the channel mid-file")
        self.left -= len(chunk)
        return chunk


class Acceptor:
    """One thread that accepts on every open channel's socket, for the whole process: a job's
    channel costs no thread until its guest connects (a thread started and joined for every
    job was ~0.2 ms of the worker's CPU, and most jobs never connect)."""

    def __init__(self) -> None:
        self._poll = select.epoll()
        self._listening: dict[int, GuestChannel] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def watch(self, fd: int, channel: "GuestChannel") -> None:
        with self._lock:
            self._listening[fd] = channel
            self._poll.register(fd, select.EPOLLIN)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="guest-channels", daemon=True
                )
                self._thread.start()

    def forget(self, fd: int) -> None:
        """Before the socket is closed: its number may be another channel's next."""
        with self._lock:
            if self._listening.pop(fd, None) is not None:
                self._poll.unregister(fd)

    def _run(self) -> None:
        while True:
            for fd, _ in self._poll.poll():
                with self._lock:
                    channel = self._listening.get(fd)
                if channel is not None:  # else forgotten since the poll: nothing to accept
                    channel.accept_waiting()


_acceptor = Acceptor()


class GuestChannel:
    def __init__(self, directory: Path, recorder: StageRecorder) -> None:
        self.directory, self.recorder = directory, recorder
        self._server: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> Path:
        self.directory.mkdir(mode=0o700, parents=True)
        self.directory.chmod(0o711)  # the guest's uid walks through it to the socket
        path = self.directory / GUEST_CHANNEL_SOCKET
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        os.chmod(path, 0o666)
        self._server.listen(8)
        self._server.setblocking(False)  # accepted by the acceptor, when the poll says
        _acceptor.watch(self._server.fileno(), self)
        return self.directory

    def close(self) -> None:
        with self._lock:
            self._closed = True  # no connection gets a thread from now on
        if self._server is not None:
            _acceptor.forget(self._server.fileno())
            self._server.close()
        for thread in self._threads:
            thread.join(5)
        shutil.rmtree(self.directory, ignore_errors=True)

    def accept_waiting(self) -> None:
        """Serve every connection waiting on the socket, each on a thread of its own."""
        assert self._server is not None
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # none left waiting (EAGAIN), or the channel was closed meanwhile
            conn.setblocking(True)
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as stream:
            while line := stream.readline(MAX_LINE + 1):
                answer = self._answer(line, stream)
                stream.write(json.dumps(answer).encode() + b"\n")
                stream.flush()
                if not answer["ok"]:
                    return  # unread file bytes may follow a refused request: start afresh

    def _answer(self, line: bytes, stream: Any) -> dict[str, Any]:
        try:
            if len(line) > MAX_LINE:
                raise SandcellError("request line too long")
            request = json.loads(line)
            return {"ok": True} | self._dispatch(request, stream)
        except SandcellError as exc:
            return {"ok": False, "error": exc.detail}
        except (ValueError, KeyError, TypeError) as exc:
            return {"ok": False, "error": f"bad request: {type(exc).__name__}"}

    def _dispatch(self, request: dict[str, Any], stream: Any) -> dict[str, Any]:
        op = _checked(request)
        if op == "commit_stage":
            files = [(str(f["path"]), int(f["size"])) for f in request.get("files", [])]
            if any(size < 0 or size > MAX_FILE for _, size in files):
                raise SandcellError("file size out of range")
            streams = [(path, _Exactly(stream, size)) for path, size in files]
            return {"files": self.recorder.commit_stage(str(request["name"]), streams)}  # type: ignore[arg-type]
        if op == "once":
            return {"run": self.recorder.once(str(request["key"]))}
        return {"stages": self.recorder.completed()}


def _checked(request: Any) -> str:
    """The request's op, once every field in it is one that op defines."""
    if not isinstance(request, dict):
        raise SandcellError("a request is one JSON object")
    op = request.get("op")
    if not isinstance(op, str) or op not in FIELDS:
        raise SandcellError(f"unknown op {op!r}")
    files = request.get("files", [])
    if not isinstance(files, list) or not all(isinstance(item, dict) for item in files):
        raise SandcellError("files is a list of {path, size} objects")
    extra = set(request) - FIELDS[op]
    for item in files:
        extra |= set(item) - FILE_FIELDS
    if extra:
        raise SandcellError(f"fields {sorted(extra)} are not part of {op!r}: request refused")
    return op


class SocketGuestChannels:
    """Opens one GuestChannel per sandbox under `root` (private to the worker)."""

    def __init__(self, root: Path) -> None:
        self.root = root.absolute()  # runsc bind-mounts need absolute sources
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        # Traversable, not listable: bwrap opens its bind sources as the sandbox's own uid,
        # and only a sandbox given its channel's (random) name can get through to it.
        self.root.chmod(0o711)

    def open(self, sandbox_id: str, recorder: StageRecorder) -> GuestChannel:
        # A random name, not the id: unguessable, it is what keeps other host users (the root
        # is traversable) off the socket; and short, as a socket path has only ~107 bytes.
        directory = self.root / secrets.token_hex(DIR_NAME_BYTES)
        if len(bytes(directory / GUEST_CHANNEL_SOCKET)) > SUN_PATH_MAX:
            raise SandcellError(f"guest channel path too long for a unix socket: {directory}")
        channel = GuestChannel(directory, recorder)
        channel.start()
        return channel

    def close(self) -> None:
        """The worker is done: its root goes with it, if empty (every channel was closed)."""
        with contextlib.suppress(OSError):
            self.root.rmdir()

    def reap(self) -> list[str]:
        """Remove the socket directories a crashed run of this worker left (none is served)."""
        removed = []
        for leftover in sorted(self.root.iterdir()):
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(f"guest channel {leftover.name}")
        return removed
