"""The SDK against the real app in-process: every endpoint, error mapping, retries, streaming.

Jobs run on a real worker thread over the host-process fake runtime; sessions on the fake
session runtime (the e2e tests run both on gVisor over a socket)."""

import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import sandcell_client
from sandcell.api import problems
from sandcell.domain import errors as domain
from sandcell.services.worker import Worker, WorkerConfig
from sandcell_client import (
    AsyncClient,
    ChecksumMismatch,
    Client,
    Forbidden,
    IdempotencyKeyReused,
    InvalidRequest,
    LogEvent,
    NotFound,
    TransportError,
    Unauthorized,
)
from sandcell_client._exceptions import api_error
from tests.conftest import ADMIN_KEY, Api
from tests.fakes import FakeImages, HostProcessRuntime

CHART_JOB = (
    "import sys; print('rows 3'); print('warn', file=sys.stderr); "
    "open('/output/chart.png','wb').write(b'\\x89PNG' + bytes(range(256)) * 4)"
)


class ThroughTestClient(httpx.BaseTransport):
    """The sync client's requests through the app's TestClient (which is built on httpx2 once
    that is installed, so its own transport does not fit httpx.Client). `fault` may break a
    request before or after it reached the app, the way a network does."""

    def __init__(self, http: Any) -> None:
        self._http = http
        self.sent: list[httpx.Request] = []
        self.fault: Any = None

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        if self.fault is not None and self.fault(request, before=True):
            raise httpx.ConnectError("connection refused", request=request)
        answer = self._http.request(
            request.method,
            str(request.url),
            headers=list(request.headers.multi_items()),
            content=request.read(),
        )
        if self.fault is not None and self.fault(request, before=False):
            raise httpx.ReadError("connection reset by peer", request=request)
        headers = [(k, v) for k, v in answer.headers.multi_items() if k != "content-encoding"]
        return httpx.Response(answer.status_code, headers=headers, content=answer.content)


@pytest.fixture
def worker(api: Api) -> Iterator[None]:
    config = WorkerConfig("wrk_sdk", slots=2, lease_s=5, heartbeat_s=0.1, poll_s=0.01)
    running = Worker(api.services.store, api.blobs, HostProcessRuntime(), FakeImages(), config)
    stop = threading.Event()
    thread = threading.Thread(target=running.serve, args=(stop,))
    thread.start()
    yield
    stop.set()
    thread.join(15)


def _key(api: Api, name: str) -> str:
    return api.tenant(name)["Authorization"].split()[1]


def _sync(api: Api, key: str) -> tuple[Client, ThroughTestClient]:
    transport = ThroughTestClient(api.http)
    return Client("http://testserver", key, transport=transport), transport


def _async(api: Api, key: str) -> AsyncClient:
    transport = httpx.ASGITransport(app=api.http.app)
    return AsyncClient("http://testserver", key, transport=transport)


def test_the_public_api_is_pinned() -> None:
    assert sandcell_client.__all__ == sorted(sandcell_client.__all__)
    for name in sandcell_client.__all__:
        assert getattr(sandcell_client, name) is not None
    assert {"Client", "AsyncClient", "Session", "AsyncSession", "SandcellError"} <= set(
        sandcell_client.__all__
    )


@pytest.mark.parametrize(("cls", "status", "slug"), problems.PROBLEM_TYPES)
def test_every_problem_type_of_the_api_maps_to_its_own_error(
    cls: type[domain.SandcellError], status: int, slug: str
) -> None:
    """The server's own problem table, answered by its own handler, read by the SDK."""
    exc = cls("something specific")
    answer = problems._domain_error(None, exc)  # type: ignore[arg-type]
    response = httpx.Response(answer.status_code, headers=answer.headers, content=answer.body)
    error = api_error(response)
    expected = {"IdempotencyMismatch": "IdempotencyKeyReused"}.get(cls.__name__, cls.__name__)
    assert type(error).__name__ == expected
    assert error.status == type(error).status_code == status
    assert error.type == f"/problems/{slug}" and error.detail == "something specific"
    assert isinstance(error, sandcell_client.ApiError | sandcell_client.SandcellError)


def test_an_unknown_problem_type_falls_back_to_its_status() -> None:
    body = {"type": "/problems/brand-new", "title": "t", "status": 404, "detail": "gone"}
    error = api_error(httpx.Response(404, json=body))
    assert type(error) is NotFound and error.detail == "gone"
    error = api_error(httpx.Response(418, text="teapot"))
    assert type(error) is sandcell_client.ApiError and "teapot" in error.detail


def test_files_jobs_logs_artifacts_and_retirement(api: Api, worker: None, tmp_path: Path) -> None:
    client, _ = _sync(api, _key(api, "sdk"))
    stored = client.upload("data.csv", b"x\n1\n")
    assert stored.size == 4 and stored.sha256 == hashlib.sha256(b"x\n1\n").hexdigest()
    assert client.file(stored.id).name == "data.csv"
    seen: list[LogEvent] = []
    result = client.run(CHART_JOB, files={"data.csv": b"x\n1\n"}, on_log=seen.append)
    assert result.ok and result.stdout == "rows 3\n" and result.stderr == "warn\n"
    assert "".join(e.text for e in seen if e.kind == "stdout") == "rows 3\n"
    [png] = result.outputs
    assert client.read(png)[:4] == b"\x89PNG"
    [path] = client.download_outputs(result, tmp_path / "out")
    assert path == tmp_path / "out" / "chart.png"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == png.sha256
    assert client.artifact(png.artifact_id).job_id == result.id
    signed = client.signed_url(png.artifact_id)
    assert api.http.get(signed.url.removeprefix("http://testserver")).content == path.read_bytes()
    events = list(client.stream_logs(result.id))
    assert events[-1].kind == "end" and events[-1].state == "completed"
    assert client.logs(result.id).stdout == "rows 3\n"
    assert result.id in {job.id for job in client.iter_jobs()}
    assert [j.id for j in client.jobs(state="completed").items] == [result.id]
    report = client.retire(result.id)
    assert report.job_id == result.id and report.removed["artifacts"]
    client.delete_file(stored.id)
    with pytest.raises(NotFound):
        client.file(stored.id)


def test_submit_is_idempotent_and_errors_are_typed(api: Api) -> None:
    client, _ = _sync(api, _key(api, "sdk-errors"))
    job = client.submit({"code": "print(1)"}, idempotency_key="same")
    assert client.submit({"code": "print(1)"}, idempotency_key="same").id == job.id
    with pytest.raises(IdempotencyKeyReused):
        client.submit({"code": "print(2)"}, idempotency_key="same")
    assert client.cancel(job.id).id == job.id
    assert client.wait(job.id, timeout=10).state == "cancelled"
    with pytest.raises(NotFound) as missing:
        client.job("job_missing")
    assert missing.value.request_id
    with pytest.raises(InvalidRequest) as invalid:
        client.submit({"code": "1", "limits": {"memory_mb": 10**9}})
    assert invalid.value.errors[0].field == "limits.memory_mb"
    with pytest.raises(Unauthorized):
        Client("http://testserver", "sc_wrong", transport=ThroughTestClient(api.http)).jobs()
    admin = Client("http://testserver", ADMIN_KEY, transport=ThroughTestClient(api.http))
    with pytest.raises(Forbidden):
        admin.jobs()


def test_submit_can_wait_for_the_result_in_both_clients(api: Api, worker: None) -> None:
    key = _key(api, "sdk-wait")
    client, transport = _sync(api, key)
    job = client.submit({"code": "print(1)"}, wait=30)
    assert job.state == "completed" and job.terminal
    [sent] = [r for r in transport.sent if r.url.path == "/v1/jobs"]
    assert sent.url.params["wait"] == "30"  # one request: no long poll after it

    async def main() -> Any:
        async with _async(api, key) as aclient:
            return await aclient.submit({"code": "print(2)"}, wait=30)

    assert anyio.run(main).state == "completed"


def test_admin_secrets_and_health_through_the_sdk(api: Api) -> None:
    admin, _ = _sync(api, ADMIN_KEY)
    tenant = admin.create_tenant("sdk-admin")
    key = admin.create_key(tenant.id)
    client, _ = _sync(api, key.key)
    assert client.put_secret("tok", "v-123").name == "tok"
    assert [s.name for s in client.secrets()] == ["tok"]
    client.delete_secret("tok")
    assert client.secrets() == []
    assert client.health() == {"status": "ok"}
    admin.revoke_key(key.id)
    with pytest.raises(Unauthorized):
        client.jobs()
    assert any(e["action"] for e in admin.audit(tenant_id=tenant.id))


def test_sessions_through_the_sync_sdk(api: Api, tmp_path: Path) -> None:
    client, _ = _sync(api, _key(api, "sdk-ses"))
    with client.sessions.create(idle_timeout_s=30) as session:
        session.execute("x = 41")
        assert session.execute("print(x + 1)").stdout == "42\n"
        events = list(session.execute_stream("print('streamed')"))
        assert events[0].type == "stdout" and events[0].text == "streamed\n"
        assert events[-1].type == "result" and events[-1].cell is not None
        assert events[-1].cell.stdout == "streamed\n"
        assert session.upload("dir/a.txt", b"hello").size == 5
        assert session.download("dir/a.txt") == b"hello"
        assert session.download_to("dir/a.txt", tmp_path / "a.txt").read_bytes() == b"hello"
        assert [f.name for f in session.files("dir")] == ["a.txt"]
        assert session.pause().state == "paused"
        assert session.resume().state == "running"
        session.interrupt()
        assert api.session_runtime.sandboxes[-1].interrupts == 1  # the resumed sandbox's
        assert session.preview_url(8000).startswith("http://testserver/v1/previews/")
        assert client.sessions.get(session.id).info.executions >= 3
        assert session.id in {s.id for s in client.sessions.list(live=True)}
        with pytest.raises(NotFound):
            session.download("nope.txt")
    assert session.info.state == "stopped"
    with pytest.raises(sandcell_client.Conflict):
        session.execute("1")


def test_async_client_runs_a_job_and_a_session(api: Api, worker: None, tmp_path: Path) -> None:
    key = _key(api, "sdk-async")

    async def main() -> dict[str, Any]:
        async with _async(api, key) as client:
            chunks: list[LogEvent] = []
            result = await client.run(CHART_JOB, on_log=chunks.append, timeout_s=30)
            paths = await client.download_outputs(result, tmp_path / "async")
            events = [e async for e in client.stream_logs(result.id)]
            async with await client.sessions.create() as session:
                await session.execute("y = 6")
                cell = [e async for e in session.execute_stream("print(y * 7)")]
                await session.upload("f.bin", bytes(range(10)))
                back = await session.download("f.bin")
            with pytest.raises(NotFound):
                await client.job("job_nope")
            return {"result": result, "paths": paths, "events": events, "cell": cell, "back": back}

    seen = anyio.run(main)
    assert seen["result"].ok and seen["result"].stdout == "rows 3\n"
    assert seen["paths"][0].read_bytes()[:4] == b"\x89PNG"
    assert seen["events"][-1].kind == "end"
    assert seen["cell"][0].text == "42\n" and seen["cell"][-1].type == "result"
    assert seen["back"] == bytes(range(10))


def test_a_submit_whose_answer_is_lost_is_retried_into_the_same_job(api: Api) -> None:
    """The request reached the server, the connection broke before the answer: the retry
    carries the same Idempotency-Key, so there is exactly one job."""
    client, transport = _sync(api, _key(api, "sdk-retry"))
    broken = {"count": 0}

    def drop_first_answer(request: httpx.Request, before: bool) -> bool:
        if before or request.url.path != "/v1/jobs" or broken["count"]:
            return False
        broken["count"] += 1
        return True

    transport.fault = drop_first_answer
    job = client.submit({"code": "print('once')"})
    submits = [r for r in transport.sent if r.url.path == "/v1/jobs" and r.method == "POST"]
    assert len(submits) == 2
    assert submits[0].headers["idempotency-key"] == submits[1].headers["idempotency-key"]
    assert [j.id for j in client.jobs().items] == [job.id]


def test_only_safe_requests_are_resent(api: Api) -> None:
    client, transport = _sync(api, _key(api, "sdk-unsafe"))
    transport.fault = lambda request, before: not before and request.url.path == "/v1/sessions"
    with pytest.raises(TransportError):
        client.sessions.create()
    assert len([r for r in transport.sent if r.url.path == "/v1/sessions"]) == 1
    refused = {"count": 0}

    def refuse_once(request: httpx.Request, before: bool) -> bool:
        refused["count"] += before
        return before and refused["count"] == 1

    transport.fault = refuse_once
    assert client.upload("a.txt", b"a").size == 1  # never sent the first time: safe to resend


def test_a_corrupted_download_is_refused_and_leaves_no_file(
    api: Api, worker: None, tmp_path: Path
) -> None:
    key = _key(api, "sdk-sha")
    client, _ = _sync(api, key)
    result = client.run(CHART_JOB)
    [png] = result.outputs

    def corrupt(request: httpx.Request) -> httpx.Response:
        answer = api.http.get(str(request.url), headers=dict(request.headers))
        assert answer.status_code == 200 and answer.content[:4] == b"\x89PNG"
        return httpx.Response(200, headers=answer.headers, content=b"X" + answer.content[1:])

    bad = Client("http://testserver", key, transport=httpx.MockTransport(corrupt))
    with pytest.raises(ChecksumMismatch):
        bad.download(png, tmp_path / "out" / "chart.png")
    with pytest.raises(ChecksumMismatch):
        bad.read(png)
    assert list((tmp_path / "out").iterdir()) == []


def test_output_paths_cannot_escape_the_download_directory(tmp_path: Path) -> None:
    record = {"id": "job_x", "state": "completed", "outputs": []}
    evil = {"artifact_id": "art_1", "path": "../evil", "size": 1, "sha256": "0" * 64}
    job = sandcell_client.Job.model_validate(record | {"outputs": [evil]})
    client = Client("http://testserver", "k", transport=httpx.MockTransport(lambda r: None))  # type: ignore[arg-type, return-value]
    with pytest.raises(sandcell_client.SandcellError, match="outside"):
        client.download_outputs(job, tmp_path / "out")
    assert not (tmp_path / "evil").exists()


def test_records_keep_unknown_fields_and_mapping_access() -> None:
    job = sandcell_client.Job.model_validate({"id": "j", "state": "running", "new_field": 1})
    assert job["id"] == "j" and job.get("new_field") == 1 and not job.terminal
    assert json.loads(job.model_dump_json())["new_field"] == 1


def test_session_history_and_quota_changes_through_both_clients(api: Api) -> None:
    admin, _ = _sync(api, ADMIN_KEY)
    tenant = admin.create_tenant("sdk-history")
    changed = admin.set_quotas(tenant.id, sessions=2, burst=None)
    assert changed.quota_overrides == {"sessions": 2} and changed.quotas["sessions"] == 2
    with pytest.raises(InvalidRequest):
        admin.set_quotas(tenant.id, sessions=-1)
    with pytest.raises(NotFound):
        admin.set_quotas("ten_nope", sessions=1)
    key = admin.create_key(tenant.id).key
    client, _ = _sync(api, key)
    with client.sessions.create() as session:
        for code in ("a = 1", "print(a + 1)", "1 / 0"):
            session.execute(code)
        cells = session.cells()
        assert [(c.seq, c.code) for c in cells] == [(1, "a = 1"), (2, "print(a + 1)"), (3, "1 / 0")]
        assert cells[1].stdout == "2\n" and cells[2].error is not None
        assert [c.seq for c in session.cells(after=1, limit=1)] == [2]

    async def main() -> list[int]:
        async with _async(api, key) as aclient, _async(api, ADMIN_KEY) as aadmin:
            found = await aclient.sessions.attach(session.id).cells(limit=2)
            assert (await aadmin.set_quotas(tenant.id, sessions=None)).quota_overrides == {}
            return [c.seq for c in found]

    assert anyio.run(main) == [2, 3]  # the history outlives the stopped session


class ScriptedDirect:
    """The API's `/direct` and a worker's cells, as a client sees them: each mint gives a new
    token; the worker answers each cell with the next of `answers` (status, problem type)."""

    WORKER = "http://worker.test/direct/sessions/ses_1/execute"

    def __init__(self, answers: list[tuple[int, str]]) -> None:
        self.answers, self.mints, self.cells = answers, 0, list[str]()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/sessions/ses_1/direct":
            assert request.headers["authorization"] == "Bearer sc_key"
            self.mints += 1
            access = {"execute_url": self.WORKER, "token": f"tok{self.mints}", "expires_at": ""}
            return httpx.Response(200, json=access)
        assert str(request.url) == self.WORKER, request.url
        self.cells.append(request.headers["authorization"])
        status, kind = self.answers.pop(0)
        if status == 200:
            return httpx.Response(200, json={"stdout": "", "result": "2"})
        problem = {"type": kind, "title": kind, "status": status, "detail": kind}
        return httpx.Response(status, json=problem, headers={"content-type": PROBLEM})


PROBLEM = "application/problem+json"


@pytest.mark.parametrize(
    "refusal", [(401, "unauthorized"), (409, "conflict")], ids=["token-lapsed", "moved"]
)
def test_a_direct_cell_refused_before_it_ran_asks_the_api_again_once(
    refusal: tuple[int, str],
) -> None:
    script = ScriptedDirect([refusal, (200, "")])
    client = Client("http://api.test", "sc_key", transport=httpx.MockTransport(script))
    session = client.sessions.attach("ses_1")
    access = session.go_direct()
    assert access.execute_url == ScriptedDirect.WORKER and script.mints == 1
    assert session.execute("1+1").result == "2"
    assert script.mints == 2 and script.cells == ["Bearer tok1", "Bearer tok2"]  # never the key


def test_a_direct_cell_whose_sandbox_died_is_not_sent_again() -> None:
    script = ScriptedDirect([(409, "session-unavailable"), (200, "")])
    client = Client("http://api.test", "sc_key", transport=httpx.MockTransport(script))
    session = client.sessions.attach("ses_1")
    session.go_direct()
    with pytest.raises(sandcell_client.SessionUnavailable):
        session.execute("1+1")
    assert script.mints == 1 and len(script.cells) == 1  # the cell had started: not re-run


def test_the_async_client_sends_cells_direct_too() -> None:
    script = ScriptedDirect([(401, "unauthorized"), (200, "")])

    async def main() -> None:
        transport = httpx.MockTransport(script)
        async with AsyncClient("http://api.test", "sc_key", transport=transport) as client:
            session = client.sessions.attach("ses_1")
            await session.go_direct()
            assert (await session.execute("1+1")).result == "2"

    anyio.run(main)
    assert script.mints == 2 and script.cells == ["Bearer tok1", "Bearer tok2"]
