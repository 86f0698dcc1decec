"""How the API reaches the worker that holds a session's sandbox.

The API never touches a runtime: a worker runs the sandbox and exposes a SessionHost; API
replicas reach it in-process (tests) or over HTTP (`sandcell.remote`).
"""

from collections.abc import Iterator
from typing import Any, Protocol

from sandcell.domain.records import WorkerInfo
from sandcell.domain.sessions import Session
from sandcell.ports.sessions import CellResult

HttpReply = tuple[int, list[tuple[str, str]], bytes]
# ("event", {"type": "stdout"|"stderr"|"display", …}), then ("result", CellResult) or
# ("error", {"type", "detail"}).
StreamItem = tuple[str, dict[str, Any]]


class SessionHost(Protocol):
    def start(self, session: Session) -> None: ...
    def execute(self, session_id: str, code: str, timeout_s: float) -> CellResult: ...
    def execute_stream(
        self, session_id: str, code: str, timeout_s: float
    ) -> Iterator[StreamItem]: ...
    def interrupt(self, session_id: str) -> None: ...
    def pause(self, session_id: str) -> bool: ...
    def resume(self, session: Session) -> None: ...
    def stop(self, session_id: str, reason: str) -> None: ...
    def put_file(self, session_id: str, path: str, content: bytes) -> int: ...
    def get_file(self, session_id: str, path: str) -> bytes: ...
    def list_files(self, session_id: str, path: str) -> list[dict[str, Any]]: ...
    def http(
        self,
        session_id: str,
        port: int,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> HttpReply: ...


class SessionHosts(Protocol):
    def host(self, worker: WorkerInfo) -> SessionHost: ...
