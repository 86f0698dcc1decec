"""The synchronous client."""

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx

from sandcell_client._errors import raise_for_problem

TERMINAL = {"completed", "failed", "cancelled"}


class Client:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        # TCP_NODELAY: a request's headers and body are separate writes, and Nagle would hold
        # the body back for the server's delayed ACK (~40 ms) on every POST.
        nodelay = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport or httpx.HTTPTransport(socket_options=nodelay),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        raise_for_problem(response)
        return response

    # files and jobs

    def upload(self, name: str, content: bytes | BinaryIO) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", "/v1/files", files={"file": (name, content)}
        ).json()
        return result

    def submit(self, body: dict[str, Any], idempotency_key: str | None = None) -> dict[str, Any]:
        """Submit a job. The key defaults to a fresh one, so a retried call makes one job."""
        key = idempotency_key or str(uuid.uuid4())
        for attempt in range(3):
            try:
                response = self._call(
                    "POST", "/v1/jobs", json=body, headers={"Idempotency-Key": key}
                )
                result: dict[str, Any] = response.json()
                return result
            except httpx.TransportError:
                if attempt == 2:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")

    def job(self, job_id: str, wait: float = 0) -> dict[str, Any]:
        params = {"wait": wait} if wait else None
        timeout = httpx.Timeout(wait + 30) if wait else httpx.USE_CLIENT_DEFAULT
        result: dict[str, Any] = self._call(
            "GET", f"/v1/jobs/{job_id}", params=params, timeout=timeout
        ).json()
        return result

    def wait(self, job_id: str, timeout: float = 3600) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        job = self.job(job_id)
        while job["state"] not in TERMINAL and time.monotonic() < deadline:
            job = self.job(job_id, wait=min(30, max(1, deadline - time.monotonic())))
        return job

    def jobs(
        self, state: str | None = None, cursor: str | None = None, limit: int = 50
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if state:
            params["state"] = state
        if cursor:
            params["cursor"] = cursor
        result: dict[str, Any] = self._call("GET", "/v1/jobs", params=params).json()
        return result

    def logs(self, job_id: str) -> dict[str, str]:
        result: dict[str, str] = self._call("GET", f"/v1/jobs/{job_id}/logs").json()
        return result

    def stream_logs(self, job_id: str) -> Iterator[tuple[str, str]]:
        """Yield (event, data) pairs as the job prints; ends with ("end", state json)."""
        headers = {"Accept": "text/event-stream"}
        with self._http.stream(
            "GET", f"/v1/jobs/{job_id}/logs", headers=headers, timeout=None
        ) as response:
            if response.status_code >= 400:
                response.read()
                raise_for_problem(response)
            event, data = "message", []
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    yield event, "\n".join(data)
                    event, data = "message", []

    def cancel(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/jobs/{job_id}/cancel").json()
        return result

    def retire(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("DELETE", f"/v1/jobs/{job_id}").json()
        return result

    # artifacts

    def artifact(self, artifact_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/artifacts/{artifact_id}").json()
        return result

    def download(self, artifact_id: str, dest: Path) -> Path:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self._http.stream("GET", f"/v1/artifacts/{artifact_id}/content") as response:
            if response.status_code >= 400:
                response.read()
                raise_for_problem(response)
            with dest.open("wb") as out:
                for chunk in response.iter_bytes():
                    out.write(chunk)
        return dest

    def signed_url(self, artifact_id: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/artifacts/{artifact_id}/url").json()
        return result

    # admin

    def create_tenant(self, name: str, **extra: Any) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", "/v1/admin/tenants", json={"name": name, **extra}
        ).json()
        return result

    def create_key(self, tenant_id: str, scopes: list[str] | None = None) -> dict[str, Any]:
        body = {"scopes": scopes} if scopes else {}
        result: dict[str, Any] = self._call(
            "POST", f"/v1/admin/tenants/{tenant_id}/keys", json=body
        ).json()
        return result

    def revoke_key(self, key_id: str) -> None:
        self._call("DELETE", f"/v1/admin/keys/{key_id}")

    # secrets

    def put_secret(self, name: str, value: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", "/v1/secrets", json={"name": name, "value": value}
        ).json()
        return result

    # sessions

    def session(self, **body: Any) -> "Session":
        """Start a session; use it as a context manager to stop it at the end."""
        data = self._call("POST", "/v1/sessions", json=body, timeout=httpx.Timeout(120)).json()
        return Session(self, data)

    def session_call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._call(method, path, **kwargs)


class Session:
    """A stateful interpreter in its own sandbox."""

    def __init__(self, client: Client, data: dict[str, Any]) -> None:
        self._client, self.data, self.id = client, data, data["id"]

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _call(self, method: str, suffix: str, **kwargs: Any) -> httpx.Response:
        return self._client.session_call(method, f"/v1/sessions/{self.id}{suffix}", **kwargs)

    def execute(self, code: str, timeout: float = 60) -> dict[str, Any]:
        body = {"code": code, "timeout_s": timeout}
        result: dict[str, Any] = self._call(
            "POST", "/execute", json=body, timeout=httpx.Timeout(timeout + 30)
        ).json()
        return result

    def interrupt(self) -> None:
        self._call("POST", "/interrupt")

    def upload(self, path: str, content: bytes) -> dict[str, Any]:
        result: dict[str, Any] = self._call("PUT", f"/files/{path}", content=content).json()
        return result

    def download(self, path: str) -> bytes:
        return self._call("GET", f"/files/{path}").content

    def files(self, path: str = "") -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self._call("GET", "/files", params={"path": path}).json()[
            "items"
        ]
        return items

    def pause(self) -> dict[str, Any]:
        self.data = self._call("POST", "/pause", timeout=httpx.Timeout(120)).json()
        return self.data

    def resume(self) -> dict[str, Any]:
        self.data = self._call("POST", "/resume", timeout=httpx.Timeout(120)).json()
        return self.data

    def preview_url(self, port: int) -> str:
        url: str = self._call("POST", f"/ports/{port}/url").json()["url"]
        return url

    def refresh(self) -> dict[str, Any]:
        self.data = self._call("GET", "").json()
        return self.data

    def stop(self) -> dict[str, Any]:
        self.data = self._call("DELETE", "").json()
        return self.data
