"""The SDK against the real app in-process (the TestClient's transport)."""

import pytest

from sandcell_client import Client, InvalidRequest, NotFound
from tests.conftest import Api


def _sdk(api: Api) -> Client:
    key = api.tenant("sdk")["Authorization"].split()[1]
    return Client("http://testserver", key, transport=api.http._transport)


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
