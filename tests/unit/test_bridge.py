"""The in-sandbox loopback bridge, run on the host as it runs in a sandbox (`python -I -S -c`).

Behind it: a unix socket server the test owns. In front: plain TCP clients on 127.0.0.1.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandcell.runtime import bridge

Handler = Callable[[socket.socket], None]


class UnixServer:
    """A thread accepting on a unix socket and running `handler` per connection."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.handler = handler
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.listener.accept()
                self.accepted += 1
                threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            self.handler(conn)

    def close(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()


def echo_after_eof(conn: socket.socket) -> None:
    """Read until the client's FIN, then answer with everything it sent (a half-close test)."""
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    conn.sendall(b"got:" + data)


def answer_and_close(conn: socket.socket) -> None:
    conn.recv(65536)
    conn.sendall(b"bye")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def start_bridge(tmp_path: Path) -> Iterator[Callable[[Handler], tuple[int, int]]]:
    """Start a bridge in front of a unix server running `handler`; yields (port, bridge pid)."""
    source = Path(bridge.__file__).read_text()
    started: list[tuple[int, UnixServer]] = []

    def start(handler: Handler) -> tuple[int, int]:
        path = tmp_path / f"proxy-{len(started)}.sock"
        server = UnixServer(path, handler)
        port = free_port()
        argv = [sys.executable, "-I", "-S", "-c", source, "127.0.0.1", str(port), str(path)]
        done = subprocess.run(argv, capture_output=True, timeout=10, check=True)
        pid = int(done.stdout)
        started.append((pid, server))
        return port, pid

    yield start
    for pid, server in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        server.close()


def test_listening_when_the_command_returns_and_half_close_is_passed_on(
    start_bridge: Callable[[Handler], tuple[int, int]],
) -> None:
    port, _ = start_bridge(echo_after_eof)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(b"hello")
        client.shutdown(socket.SHUT_WR)
        assert _read_all(client) == b"got:hello"


def test_large_transfers_both_ways_under_back_pressure(
    start_bridge: Callable[[Handler], tuple[int, int]],
) -> None:
    port, _ = start_bridge(echo_after_eof)
    payload = os.urandom(8 * 1024 * 1024)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        # Send everything before reading anything: the bridge must buffer, not deadlock or drop.
        sender = threading.Thread(target=lambda: _send_then_fin(client, payload))
        sender.start()
        received = _read_all(client)
        sender.join()
    assert received == b"got:" + payload


def test_many_connections_at_once_one_process(
    start_bridge: Callable[[Handler], tuple[int, int]],
) -> None:
    port, pid = start_bridge(echo_after_eof)
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(40)]
    try:
        for index, client in enumerate(clients):
            client.sendall(str(index).encode())
            client.shutdown(socket.SHUT_WR)
        answers = [_read_all(client) for client in clients]
    finally:
        for client in clients:
            client.close()
    assert answers == [f"got:{i}".encode() for i in range(40)]
    assert _threads(pid) == 1  # one task of the job's budget, whatever the connection count


def test_an_idle_client_after_the_upstream_closed_costs_no_cpu(
    start_bridge: Callable[[Handler], tuple[int, int]],
) -> None:
    port, pid = start_bridge(answer_and_close)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(b"hi")
        assert client.recv(100) == b"bye"
        before = _cpu_ticks(pid)
        time.sleep(0.5)  # the client keeps the connection (a pooled keep-alive would)
        assert _cpu_ticks(pid) - before <= 2
        assert client.recv(100) == b""  # and it sees the close


def test_no_upstream_socket_closes_the_client(
    start_bridge: Callable[[Handler], tuple[int, int]], tmp_path: Path
) -> None:
    port, _ = start_bridge(answer_and_close)
    for sock in tmp_path.glob("*.sock"):
        sock.unlink()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        assert client.recv(100) == b""


def _send_then_fin(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(1 << 20):
        data += chunk
    return data


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime
