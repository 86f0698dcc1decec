"""An idle connection stays open on sandcell's servers for longer than their clients keep one.

With uvicorn's and httpx's defaults both at 5 s, a request sent 5 s after the last could go out
on a connection the server was closing, and fail ("Server disconnected"); a session's cell is
not resent, so its caller saw a 503. Now the clients drop an idle connection first.
"""

import http.client
import select
import socket
import sqlite3
import time
from urllib.parse import urlsplit

from sandcell.remote.session_client import (
    IDLE_CONNECTION_S,
    SERVER_KEEP_ALIVE_S,
    HttpSessionHost,
    worker_transport,
)
from sandcell_client import AsyncClient, Client
from tests.e2e.conftest import Server


def _still_open_after_idle(url: str, path: str) -> bool:
    """One request, then idle past the clients' limit: is the server's side still open?"""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", path)
        conn.getresponse().read()
        time.sleep(IDLE_CONNECTION_S + 1.5)  # past uvicorn's default keep-alive (5 s) too
        assert conn.sock is not None
        readable, _, _ = select.select([conn.sock], [], [], 0)
        if readable and conn.sock.recv(1, socket.MSG_PEEK) == b"":
            return False  # the server closed it
        conn.request("GET", path)  # and it still serves on it
        return conn.getresponse().status < 500
    finally:
        conn.close()


def test_the_api_and_the_workers_endpoint_outlive_their_clients_idle_limit(
    server: Server,
) -> None:
    with sqlite3.connect(server.data_dir / "sandcell.db") as db:
        [(worker_url,)] = db.execute("SELECT url FROM workers WHERE url IS NOT NULL").fetchall()
    assert _still_open_after_idle(server.url, "/healthz")
    assert _still_open_after_idle(worker_url, "/internal/sessions/nothing/list")


def test_the_clients_drop_an_idle_connection_before_the_servers_do() -> None:
    """The API's client of a worker, and the SDK's (sync and async)."""
    clients = [
        HttpSessionHost("http://127.0.0.1:1", "token", worker_transport())._http,
        Client("http://127.0.0.1:1", "sc_key")._http,
        AsyncClient("http://127.0.0.1:1", "sc_key")._http,
    ]
    for client in clients:
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert pool._keepalive_expiry == IDLE_CONNECTION_S < SERVER_KEEP_ALIVE_S
