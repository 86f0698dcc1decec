"""HttpSessionHost: the API's view of a worker's session host, over the internal endpoint."""

import base64
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx

from sandcell.domain import errors as e
from sandcell.domain.records import WorkerInfo
from sandcell.domain.sessions import Session
from sandcell.ports.session_hosts import HttpReply, StreamItem
from sandcell.ports.sessions import CellResult

TOKEN_HEADER = "X-Sandcell-Internal"
NODELAY = (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
# sandcell's servers (the API, a worker's internal endpoint) keep an idle connection open this
# long; their clients drop one after IDLE_CONNECTION_S, well before (and before uvicorn's own
# default, 5 s). With both at uvicorn's and httpx's defaults (5 s), a call 5 s after the last
# could go out on a connection the worker was closing and fail ("Server disconnected"): a cell
# is not resent, so the user saw a 503.
SERVER_KEEP_ALIVE_S = 30
IDLE_CONNECTION_S = 4.0
IDLE_POOL = httpx.Limits(keepalive_expiry=IDLE_CONNECTION_S)  # for every client of ours
ERRORS: dict[int, type[e.SandcellError]] = {
    401: e.RuntimeUnavailable,  # our token was refused: a misconfigured deployment
    404: e.NotFound,
    409: e.Conflict,
    413: e.PayloadTooLarge,
    422: e.InvalidRequest,
    502: e.PreviewUnavailable,
    503: e.RuntimeUnavailable,
}


def worker_transport() -> httpx.HTTPTransport:
    """One connection pool for calls to every worker. Its connections are not capped: each
    carries one call of the API's own, and the API's threads and streams bound those."""
    # NODELAY: httpx writes a request's headers and body separately; with Nagle on, the body
    # waits for the ACK of the headers, which the worker delays.
    limits = httpx.Limits(max_connections=None, keepalive_expiry=IDLE_CONNECTION_S)
    return httpx.HTTPTransport(socket_options=[NODELAY], limits=limits)


class HttpSessionHost:
    def __init__(
        self, url: str, token: str, transport: httpx.HTTPTransport, timeout_s: float = 60.0
    ) -> None:
        self._http = httpx.Client(
            base_url=url, headers={TOKEN_HEADER: token}, timeout=timeout_s, transport=transport
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise e.RuntimeUnavailable("the worker holding this session did not answer") from exc
        if response.status_code >= 400:
            detail = _detail(response)
            raise ERRORS.get(response.status_code, e.SandcellError)(detail)
        return response

    def start(self, session: Session) -> None:
        self._call("POST", f"/internal/sessions/{session.id}/start")

    def resume(self, session: Session) -> None:
        self._call("POST", f"/internal/sessions/{session.id}/resume")

    def execute(self, session_id: str, code: str, timeout_s: float) -> CellResult:
        body = {"code": code, "timeout_s": timeout_s}
        timeout = httpx.Timeout(timeout_s + 30)
        result: CellResult = self._call(
            "POST", f"/internal/sessions/{session_id}/execute", json=body, timeout=timeout
        ).json()
        return result

    def execute_stream(self, session_id: str, code: str, timeout_s: float) -> Iterator[StreamItem]:
        body = {"code": code, "timeout_s": timeout_s, "stream": True}
        path = f"/internal/sessions/{session_id}/execute"
        try:
            with self._http.stream("POST", path, json=body, timeout=timeout_s + 30) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ERRORS.get(response.status_code, e.SandcellError)(_detail(response))
                for line in response.iter_lines():
                    if line:
                        [(kind, item)] = json.loads(line).items()
                        yield kind, item
        except httpx.HTTPError as exc:
            raise e.RuntimeUnavailable("the worker holding this session did not answer") from exc

    def interrupt(self, session_id: str) -> None:
        self._call("POST", f"/internal/sessions/{session_id}/interrupt")

    def pause(self, session_id: str) -> bool:
        answer = self._call("POST", f"/internal/sessions/{session_id}/pause").json()
        return bool(answer["memory_kept"])

    def stop(self, session_id: str, reason: str) -> None:
        self._call("POST", f"/internal/sessions/{session_id}/stop", params={"reason": reason})

    def put_file(self, session_id: str, path: str, content: bytes) -> int:
        answer = self._call(
            "PUT", f"/internal/sessions/{session_id}/files", params={"path": path}, content=content
        ).json()
        return int(answer["size"])

    def get_file(self, session_id: str, path: str) -> bytes:
        return self._call(
            "GET", f"/internal/sessions/{session_id}/files", params={"path": path}
        ).content

    def list_files(self, session_id: str, path: str) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = self._call(
            "GET", f"/internal/sessions/{session_id}/list", params={"path": path}
        ).json()
        return entries

    def http(
        self,
        session_id: str,
        port: int,
        method: str,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes,
    ) -> HttpReply:
        request = {
            "port": port,
            "method": method,
            "target": target,
            "headers": headers,
            "body": base64.b64encode(body).decode(),
        }
        answer = self._call("POST", f"/internal/sessions/{session_id}/http", json=request).json()
        pairs = [(str(k), str(v)) for k, v in answer["headers"]]
        return int(answer["status"]), pairs, base64.b64decode(answer["body"])


class HttpSessionHosts:
    def __init__(self, token: str) -> None:
        self.token = token
        self._hosts: dict[str, HttpSessionHost] = {}
        # Made with the API, not on a tenant's first call to a worker: httpx loads httpcore
        # (and trio, where it is installed) with its first transport, ~0.2 s, and each
        # transport loads the CA bundle, ~20 ms.
        self._transport = worker_transport()

    def host(self, worker: WorkerInfo) -> HttpSessionHost:
        if worker.url is None:
            raise e.RuntimeUnavailable("this worker runs no sessions")
        if worker.url not in self._hosts:
            self._hosts[worker.url] = HttpSessionHost(worker.url, self.token, self._transport)
        return self._hosts[worker.url]


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text[:300]))
    except ValueError:
        return response.text[:300]
