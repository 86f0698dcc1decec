"""A DNS server on the host's loopback that answers every name: what a sandbox must not reach.

It listens on 127.0.0.1 at a random port and answers each A query with 127.0.0.1, so a probe
that reaches it gets an answer: a "no DNS" check built on it can fail.
"""

import contextlib
import secrets
import socket
import struct
import threading
from types import TracebackType


def query(name: str) -> bytes:
    """A recursive A query for `name`."""
    header = struct.pack(">HHHHHH", secrets.randbelow(1 << 16), 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(part)]) + part.encode() for part in name.split("."))
    return header + labels + b"\0" + struct.pack(">HH", 1, 1)


def answered_address(reply: bytes) -> str:
    """The address of the one A record in a reply of `LoopbackDns`."""
    return socket.inet_ntoa(reply[-4:])


def _answer(request: bytes) -> bytes:
    end = 12
    while request[end]:  # the question's name: length-prefixed labels up to a zero byte
        end += 1 + request[end]
    question = request[12 : end + 5]
    header = request[:2] + struct.pack(">HHHHH", 0x8180, 1, 1, 0, 0)
    record = struct.pack(">HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton("127.0.0.1")
    return header + question + record


class LoopbackDns:
    """Serves until closed; `queries` lists every datagram it received."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.sock.settimeout(0.1)  # how often the thread looks at `_stop`
        self.queries: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                request, peer = self.sock.recvfrom(512)
                self.queries.append(request)
                with contextlib.suppress(IndexError, struct.error):
                    self.sock.sendto(_answer(request), peer)

    def ask(self, name: str) -> str:
        """Resolve `name` through this server from the host: proof that it answers."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
            client.settimeout(5)
            client.sendto(query(name), ("127.0.0.1", self.port))
            return answered_address(client.recv(512))

    def __enter__(self) -> "LoopbackDns":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
