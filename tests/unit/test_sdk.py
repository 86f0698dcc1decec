"""The SDK against the real app in-process (the TestClient's transport)."""

from typing import Any

import httpx
import pytest

from sandcell_client import Client, InvalidRequest, NotFound
from tests.conftest import Api


class _ThroughTestClient(httpx.BaseTransport):
    """httpx requests through the app's TestClient, which is built on httpx2 once that is
    installed (the `mcp` SDK requires it), so its own transport no longer fits httpx.Client."""

    def __init__(self, http: Any) -> None:
        self._http = http

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self._http.request(
            request.method,
            str(request.url),
            headers=list(request.headers.multi_items()),
            content=request.read(),
        )
        headers = [(k, v) for k, v in answer.headers.multi_items() if k != "content-encoding"]
        return httpx.Response(answer.status_code, headers=headers, content=answer.content)


def _sdk(api: Api) -> Client:
    key = api.tenant("sdk")["Authorization"].split()[1]
    return Client("http://testserver", key, transport=_ThroughTestClient(api.http))


def test_jobs_files_and_errors_through_the_sdk(api: Api) -> None:
    client = _sdk(api)
    stored = client.upload("data.csv", b"x\n1\n")
    job = client.submit(
        {"code": "print(1)", "inputs": [{"file_id": stored["id"], "path": "d.csv"}]}
    )
    assert job["state"] == "accepted"
    assert (
        client.submit(
            {"code": "print(1)", "inputs": [{"file_id": stored["id"], "path": "d.csv"}]},
            idempotency_key="k",
        )["id"]
        != job["id"]
    )
    assert client.job(job["id"])["id"] == job["id"]
    assert client.cancel(job["id"])["state"] == "cancelled"
    assert job["id"] in {j["id"] for j in client.jobs()["items"]}
    with pytest.raises(NotFound):
        client.job("job_missing")
    with pytest.raises(InvalidRequest) as caught:
        client.submit({"code": "1", "limits": {"memory_mb": 10**9}})
    assert caught.value.errors[0]["field"] == "limits.memory_mb"


def test_sessions_through_the_sdk(api: Api) -> None:
    client = _sdk(api)
    with client.session() as session:
        session.execute("x = 41")
        assert session.execute("print(x + 1)")["stdout"] == "42\n"
        session.upload("a.txt", b"hello")
        assert session.download("a.txt") == b"hello"
        assert [f["name"] for f in session.files()] == ["a.txt"]
    assert session.data["state"] == "stopped"
