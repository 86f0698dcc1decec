"""Notifications between processes sharing one data dir (the embedded SQLite deployment).

`sandcell serve` runs the API and its worker as two processes on one SQLite file; they wake each
other through unix datagram sockets in `<data_dir>/notify`: every process that listens binds one
socket there, and a notification is one datagram to each. A datagram that cannot be sent (the
peer is gone, its buffer is full) is dropped: the listener's fallback poll covers it.
"""

import atexit
import contextlib
import logging
import os
import secrets
import socket
import threading
from pathlib import Path

from sandcell.ports.notify import ANY, Listener, LocalNotifier, Unlisten

log = logging.getLogger("sandcell.notify")
SUFFIX = ".sock"
MAX_MESSAGE = 512


class SocketNotifier:
    """Wake-ups through `directory`; where it cannot be used (permissions), in-process only:
    the other processes then notice changes at their fallback poll."""

    def __init__(self, directory: Path) -> None:
        # Paths go through /proc/self/fd/N: a deep data dir would exceed sun_path's 108 bytes.
        self._dir_fd = _open_dir(directory)
        self._local = LocalNotifier()
        self._lock = threading.Lock()
        self._name = f"{os.getpid()}-{secrets.token_hex(6)}{SUFFIX}"
        self._socket_path = directory / self._name
        self._receiver: socket.socket | None = None
        self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sender.setblocking(False)
        self._closed = threading.Event()

    def notify(self, channel: str, payload: str = ANY) -> None:
        self._local.notify(channel, payload)  # this process's own listeners, directly
        if self._dir_fd is None:
            return
        message = f"{channel}\n{payload}".encode()[:MAX_MESSAGE]
        for name in self._peers():
            try:
                self._sender.sendto(message, self._path(name))
            except (ConnectionRefusedError, FileNotFoundError):
                # Nobody is bound there any more: a process that died without closing.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=self._dir_fd)
            except OSError as exc:  # full buffer and the like: the fallback poll covers it
                log.debug("notification to %s dropped: %s", name, exc)

    def listen(self, channel: str, listener: Listener) -> Unlisten:
        unlisten = self._local.listen(channel, listener)
        self._bind()
        return unlisten

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            if self._receiver is not None:
                self._receiver.close()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._name, dir_fd=self._dir_fd)
        self._sender.close()
        if self._dir_fd is not None:
            os.close(self._dir_fd)
        self._local.close()

    def _peers(self) -> list[str]:
        assert self._dir_fd is not None
        try:
            names = os.listdir(self._dir_fd)
        except OSError:
            return []
        return [n for n in names if n.endswith(SUFFIX) and n != self._name]

    def _path(self, name: str) -> str:
        return f"/proc/self/fd/{self._dir_fd}/{name}"

    def _bind(self) -> None:
        with self._lock:
            if self._receiver is not None or self._closed.is_set() or self._dir_fd is None:
                return
            receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                receiver.bind(self._path(self._name))
            except OSError as exc:
                receiver.close()
                log.warning("no cross-process wake-ups (fallback poll only): %s", exc)
                self._dir_fd_failed()
                return
            receiver.settimeout(0.5)  # so the reader notices close()
            self._receiver = receiver
            # A process that exits without close() (a CLI command) leaves no socket behind.
            atexit.register(_unlink_quietly, self._socket_path)
        threading.Thread(
            target=self._receive, args=(receiver,), name="notify-socket", daemon=True
        ).start()

    def _dir_fd_failed(self) -> None:
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def _receive(self, receiver: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                message = receiver.recv(MAX_MESSAGE)
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            channel, _, payload = message.decode(errors="replace").partition("\n")
            self._local.notify(channel, payload)


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _open_dir(directory: Path) -> int | None:
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("no cross-process wake-ups through %s (fallback poll only): %s", directory, exc)
        return None
