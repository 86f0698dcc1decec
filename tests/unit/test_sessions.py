"""Session service logic over a fake session runtime: lifecycle, quotas, files, previews."""

import threading
import time
from datetime import datetime
from types import SimpleNamespace

import pytest

from sandcell.services import sessions as session_service
from tests.conftest import ADMIN_KEY, Api

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


def _start(api: Api, headers: dict[str, str], **body: object) -> dict:
    answer = api.http.post("/v1/sessions", json=body, headers=headers)
    assert answer.status_code == 201, answer.text
    return answer.json()


def test_a_session_keeps_state_across_cells_and_another_tenant_sees_404(api: Api) -> None:
    alice, bob = api.tenant("alice"), api.tenant("bob")
    session = _start(api, alice)
    assert session["state"] == "running" and session["image"] == "python"
    sid = session["id"]
    api.http.post(f"/v1/sessions/{sid}/execute", json={"code": "x = 41"}, headers=alice)
    cell = api.http.post(
        f"/v1/sessions/{sid}/execute", json={"code": "print(x + 1)"}, headers=alice
    )
    assert cell.json()["stdout"] == "42\n"
    put = api.http.put(f"/v1/sessions/{sid}/files/a.txt", content=b"alice's", headers=alice)
    assert put.status_code == 200, put.text
    stream = {"Accept": "text/event-stream"}
    for method, path, extra in [
        ("GET", f"/v1/sessions/{sid}", {}),
        ("POST", f"/v1/sessions/{sid}/execute", {}),
        ("POST", f"/v1/sessions/{sid}/execute", stream),
        ("POST", f"/v1/sessions/{sid}/interrupt", {}),
        ("POST", f"/v1/sessions/{sid}/pause", {}),
        ("POST", f"/v1/sessions/{sid}/resume", {}),
        ("DELETE", f"/v1/sessions/{sid}", {}),
        ("GET", f"/v1/sessions/{sid}/files", {}),
        ("GET", f"/v1/sessions/{sid}/files/a.txt", {}),
        ("PUT", f"/v1/sessions/{sid}/files/a.txt", {}),
        ("POST", f"/v1/sessions/{sid}/ports/8000/url", {}),
    ]:
        answer = api.http.request(method, path, json={"code": "1"}, headers=bob | extra)
        assert answer.status_code == 404, (method, path, extra, answer.text)
    mine = api.http.get(f"/v1/sessions/{sid}", headers=alice).json()
    assert mine["state"] == "running" and mine["executions"] == 2
    assert api.session_runtime.sandboxes[-1].interrupts == 0
    got = api.http.get(f"/v1/sessions/{sid}/files/a.txt", headers=alice)
    assert got.content == b"alice's"


def test_a_workspace_upload_is_raw_bytes_held_to_the_file_limit_not_the_json_one(
    api: Api,
) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)["id"]
    octets = alice | {"Content-Type": "application/octet-stream"}
    big = b"x" * (256 * 1024 + 1)  # over the JSON body limit, under the file limit
    for name, content in [("big.bin", big), ("deep.json", b"[" * 100 + b"]" * 100)]:
        put = api.http.put(f"/v1/sessions/{sid}/files/{name}", content=content, headers=octets)
        assert put.status_code == 200, put.text
        got = api.http.get(f"/v1/sessions/{sid}/files/{name}", headers=alice)
        assert got.content == content
    huge = b"x" * (1024 * 1024 + 4096 + 1)
    put = api.http.put(f"/v1/sessions/{sid}/files/huge.bin", content=huge, headers=octets)
    assert put.status_code == 413, put.text


def test_files_go_in_and_out_of_the_workspace_and_never_escape_it(api: Api) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)["id"]
    put = api.http.put(f"/v1/sessions/{sid}/files/data/in.csv", content=b"a,b\n", headers=alice)
    assert put.status_code == 200 and put.json()["size"] == 4
    listing = api.http.get(f"/v1/sessions/{sid}/files", params={"path": "data"}, headers=alice)
    assert listing.json()["items"] == [{"name": "in.csv", "type": "file", "size": 4}]
    got = api.http.get(f"/v1/sessions/{sid}/files/data/in.csv", headers=alice)
    assert got.content == b"a,b\n"
    workspace = api.session_runtime.sandboxes[-1].workspace
    (workspace / "link").symlink_to("/etc/passwd")
    assert api.http.get(f"/v1/sessions/{sid}/files/link", headers=alice).status_code == 404
    (workspace / "dirlink").symlink_to("/etc")
    assert (
        api.http.get(f"/v1/sessions/{sid}/files/dirlink/passwd", headers=alice).status_code == 404
    )
    assert api.http.put(
        f"/v1/sessions/{sid}/files/dirlink/x", content=b"x", headers=alice
    ).status_code in (404, 422)
    for bad in ("../x", "a/../../x", "/etc/passwd"):
        answer = api.http.get(f"/v1/sessions/{sid}/files", params={"path": bad}, headers=alice)
        assert answer.status_code == 422, bad


def test_pause_resume_and_stop_update_the_record(api: Api) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)["id"]
    paused = api.http.post(f"/v1/sessions/{sid}/pause", headers=alice).json()
    assert paused["state"] == "paused" and paused["pause_mode"] == "workspace"
    assert (
        api.http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"}, headers=alice).status_code
        == 409
    )
    resumed = api.http.post(f"/v1/sessions/{sid}/resume", headers=alice).json()
    assert resumed["state"] == "running"
    stopped = api.http.delete(f"/v1/sessions/{sid}", headers=alice).json()
    assert stopped["state"] == "stopped" and stopped["reason"] == "stopped"
    assert api.session_runtime.sandboxes[-1].stopped


def test_session_quota_answers_429(api: Api) -> None:
    tenant = api.http.post(
        "/v1/admin/tenants", json={"name": "q", "quotas": {"sessions": 1}}, headers=ADMIN
    ).json()
    key = api.http.post(f"/v1/admin/tenants/{tenant['id']}/keys", headers=ADMIN).json()["key"]
    headers = {"Authorization": f"Bearer {key}"}
    _start(api, headers)
    refused = api.http.post("/v1/sessions", json={}, headers=headers)
    assert refused.status_code == 429 and "Retry-After" in refused.headers


def test_idle_and_ttl_reaping_stop_sessions(api: Api) -> None:
    alice = api.tenant("alice")
    idle = _start(api, alice, idle_timeout_s=0.05)["id"]
    short = _start(api, alice, ttl_s=0.05)["id"]
    time.sleep(0.1)
    assert set(api.session_host.reap(time.time())) == {idle, short}
    assert api.http.get(f"/v1/sessions/{idle}", headers=alice).json()["reason"] == "idle_timeout"
    assert api.http.get(f"/v1/sessions/{short}", headers=alice).json()["reason"] == "ttl"


def test_a_cell_longer_than_the_idle_timeout_is_not_idleness(api: Api) -> None:
    """Idle time counts from the end of the last cell; a session running one is busy."""
    alice = api.tenant("alice")
    # Margins of half a second: on a loaded machine the answer may come well after the cell.
    sid = _start(api, alice, idle_timeout_s=0.5)["id"]
    cell = threading.Thread(
        target=api.http.post,
        args=(f"/v1/sessions/{sid}/execute",),
        kwargs={"json": {"code": "import time; time.sleep(1.2)"}, "headers": alice},
    )
    cell.start()
    time.sleep(0.8)
    assert api.session_host.reap(time.time()) == []  # 0.8 s into a 1.2 s cell
    cell.join()
    assert api.session_host.reap(time.time()) == []  # it just ended
    record = api.http.get(f"/v1/sessions/{sid}", headers=alice).json()
    assert record["state"] == "running" and record["executions"] == 1
    time.sleep(0.6)
    assert api.session_host.reap(time.time()) == [sid]


def test_preview_urls_need_their_token(api: Api) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)["id"]
    url = api.http.post(f"/v1/sessions/{sid}/ports/8000/url", headers=alice).json()["url"]
    page = api.http.get(url + "index.html?q=1")
    assert page.status_code == 200 and page.text == "GET /index.html?q=1 on 8000"
    assert page.headers["content-security-policy"].startswith("sandbox")
    token = url.split("/")[3]
    forged = token.rsplit(".", 1)[0].replace(".8000.", ".22.") + "." + token.rsplit(".", 1)[1]
    assert api.http.get(f"/v1/previews/{forged}/").status_code == 401
    assert api.http.get("/v1/previews/nonsense/").status_code == 401


def test_a_preview_token_past_its_expiry_answers_401(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)["id"]
    minted = api.http.post(f"/v1/sessions/{sid}/ports/8000/url", headers=alice).json()
    url, expires = minted["url"], datetime.fromisoformat(minted["expires_at"]).timestamp()
    assert url.split("/")[3].split(".")[2] == str(int(expires))  # the expiry it is signed with
    assert api.http.get(url).status_code == 200
    # The session service's clock moves past the expiry; the token is otherwise untouched.
    monkeypatch.setattr(session_service, "time", SimpleNamespace(time=lambda: expires + 1))
    expired = api.http.get(url)
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]


def test_execute_streams_as_server_sent_events(api: Api) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)["id"]
    answer = api.http.post(
        f"/v1/sessions/{sid}/execute",
        json={"code": "print('hi')"},
        headers=alice | {"Accept": "text/event-stream"},
    )
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = [block.split("\n")[0] for block in answer.text.strip().split("\n\n")]
    assert events == ["event: stdout", "event: result"]
    other = api.tenant("bob")
    refused = api.http.post(
        f"/v1/sessions/{sid}/execute",
        json={"code": "1"},
        headers=other | {"Accept": "text/event-stream"},
    )
    assert refused.status_code == 404


def test_a_session_whose_worker_stopped_answers_409(api: Api) -> None:
    alice = api.tenant("alice")
    sid = _start(api, alice)["id"]
    [worker] = api.services.store.live_workers(0)
    api.services.store.worker_stopped(worker.id, time.time())
    gone = api.http.post(f"/v1/sessions/{sid}/execute", json={"code": "1"}, headers=alice)
    assert gone.status_code == 409
    assert gone.headers["content-type"].startswith("application/problem+json")
    assert "worker holding this session is gone" in gone.json()["detail"]
