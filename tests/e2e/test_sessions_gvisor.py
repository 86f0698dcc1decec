"""Sessions end to end: real server, real runsc, the python-data image, over HTTP."""

import base64
import json
import struct
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from sandcell.runtime.cgroups import CONTROLLERS
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.session_runsc import CHECKPOINT_DIR, CHECKPOINT_FILE
from tests.e2e.conftest import Server, host_processes_mentioning, running_server
from tests.e2e.pool_metrics import pool_figure, wait_for_pool
from tests.integration.egress_servers import TestPKI

pytestmark = pytest.mark.gvisor

CHART = """
import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv('/workspace/data.csv')
fig, ax = plt.subplots(figsize=(4, 3))
df.plot(x='day', y='sales', ax=ax)
plt.show()
df.describe()
"""


def _client(server: Server, name: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers=server.tenant(name), timeout=120)


def _sandbox_of(http: httpx.Client, sid: str) -> str:
    """The sandbox the session runs in (or ran in last), as its record says: a pooled kernel
    (`spool-<image>-<hex>`) or a cold one (`<session>-<n>`)."""
    sandbox_id = http.get(f"/v1/sessions/{sid}").json()["sandbox_id"]
    assert isinstance(sandbox_id, str) and sandbox_id
    return sandbox_id


def _pooled_session(http: httpx.Client) -> str:
    """A session that took a kernel from the worker's session pool.

    The pool's figures in /metrics come with the worker's heartbeat (every second), so right
    after an earlier test took the warm kernel they may still say "ready": such a session
    starts cold, and is stopped and asked for again once the pool has really refilled.
    """
    for _ in range(3):
        wait_for_pool(http, "python-data", kind="sessions")
        hits = pool_figure(http, "sandcell_pool_hits", "python-data", kind="sessions")
        session = http.post("/v1/sessions", json={"image": "python-data"})
        assert session.status_code == 201, session.text
        record = session.json()
        if record["pooled"]:
            break
        http.delete(f"/v1/sessions/{record['id']}")
        time.sleep(1.5)  # a heartbeat later, the figures say what the pool holds now
    assert record["pooled"] and record["sandbox_id"].startswith("spool-python-data-"), record
    deadline = time.monotonic() + 10  # the worker reports every second
    while pool_figure(http, "sandcell_pool_hits", "python-data", kind="sessions") < hits + 1:
        assert time.monotonic() < deadline, "the hit never showed in /metrics"
        time.sleep(0.2)
    return str(record["id"])


def _execute(http: httpx.Client, sid: str, code: str, timeout: float = 60) -> dict:
    answer = http.post(f"/v1/sessions/{sid}/execute", json={"code": code, "timeout_s": timeout})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_session_on_an_image_without_ipython_is_refused_before_any_sandbox(
    server: Server,
) -> None:
    """`python` has only the standard library: a kernel there would boot and then fail."""
    with _client(server, "ses-no-kernel") as http:
        answer = http.post("/v1/sessions", json={"image": "python"})
        assert answer.status_code == 422, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        [error] = answer.json()["errors"]
        assert error["field"] == "image" and "IPython" in error["message"], error
        assert http.get("/v1/sessions").json()["items"] == []


def test_a_session_keeps_state_plots_pngs_and_survives_errors(server: Server) -> None:
    with _client(server, "ses-basic") as http:
        session = http.post("/v1/sessions", json={"image": "python-data"})
        assert session.status_code == 201, session.text
        sid = session.json()["id"]
        sandbox_id = _sandbox_of(http, sid)
        assert _execute(http, sid, "x = 41")["error"] is None
        assert _execute(http, sid, "x + 1")["result"] == "42"
        rows = "day,sales\n" + "".join(f"{d},{d * 3 % 7}\n" for d in range(30))
        http.put(f"/v1/sessions/{sid}/files/data.csv", content=rows.encode()).raise_for_status()
        cell = _execute(http, sid, CHART)
        assert cell["error"] is None, cell["error"]
        png = next(d for d in cell["display"] if d["mime"] == "image/png")
        raw = base64.b64decode(png["data"])
        assert raw[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", raw[16:24])
        assert width > 100 and height > 100
        assert "count" in (cell["result"] or "")
        failing = _execute(http, sid, "1 / 0")
        assert failing["error"]["ename"] == "ZeroDivisionError" and failing["error"]["traceback"]
        assert _execute(http, sid, "x")["result"] == "41"
        listing = http.get(f"/v1/sessions/{sid}/files").json()["items"]
        assert "data.csv" in [e["name"] for e in listing]
        stopped = http.delete(f"/v1/sessions/{sid}").json()
        assert stopped["state"] == "stopped"
    assert host_processes_mentioning(sandbox_id) == []


def _codes(http: httpx.Client, sid: str, **params: int) -> list[str]:
    answer = http.get(f"/v1/sessions/{sid}/cells", params=params)
    assert answer.status_code == 200, answer.text
    return [cell["code"] for cell in answer.json()["items"]]


def test_the_cell_history_outlives_pause_and_stop_and_only_its_tenant_reads_it(
    server: Server,
) -> None:
    with _client(server, "ses-history") as http, _client(server, "ses-history-other") as other:
        sid = http.post("/v1/sessions", json={"image": "python-data"}).json()["id"]
        _execute(http, sid, "x = 41")
        _execute(http, sid, "import matplotlib.pyplot as plt; plt.plot([1, 3, 2]); plt.show()")
        _execute(http, sid, "print('<b>not bold</b>\\x00', x + 1)")
        with http.stream(
            "POST",
            f"/v1/sessions/{sid}/execute",
            json={"code": "print('streamed')\n1 / 0"},
            headers={"Accept": "text/event-stream"},
        ) as response:
            assert "event: result" in response.read().decode()
        page = http.get(f"/v1/sessions/{sid}/cells").json()
        assert [c["seq"] for c in page["items"]] == [1, 2, 3, 4] and page["next_after"] == 4
        first, chart, text, streamed = page["items"]
        assert first["code"] == "x = 41" and first["error"] is None and first["execution_count"]
        png = next(d for d in chart["display"] if d["mime"] == "image/png")
        assert base64.b64decode(png["data"])[:8] == b"\x89PNG\r\n\x1a\n"
        assert text["stdout"].startswith("<b>not bold</b>") and text["stdout"].endswith(" 42\n")
        assert "\x00" not in text["stdout"]  # stored as U+FFFD: every store can hold it
        assert streamed["stdout"] == "streamed\n"
        assert streamed["error"]["ename"] == "ZeroDivisionError"
        assert _codes(http, sid, after=2, limit=1) == [text["code"]]
        assert other.get(f"/v1/sessions/{sid}/cells").status_code == 404

        paused = http.post(f"/v1/sessions/{sid}/pause").json()
        assert paused["state"] == "paused"
        assert len(_codes(http, sid)) == 4  # read while no sandbox runs
        assert http.post(f"/v1/sessions/{sid}/resume").json()["state"] == "running"
        after = _execute(http, sid, "x + 1")
        if paused["memory_kept"]:
            assert after["result"] == "42", after
        assert http.delete(f"/v1/sessions/{sid}").json()["state"] == "stopped"
        history = http.get(f"/v1/sessions/{sid}/cells", params={"after": 4}).json()["items"]
        assert [(c["seq"], c["code"]) for c in history] == [(5, "x + 1")]
        assert other.get(f"/v1/sessions/{sid}/cells").status_code == 404


def test_a_cell_past_its_execute_timeout_is_interrupted_and_the_session_lives_on(
    server: Server,
) -> None:
    with _client(server, "ses-timeout") as http:
        sid = http.post("/v1/sessions", json={"image": "python-data"}).json()["id"]
        started = time.monotonic()
        cell = _execute(http, sid, "while True: pass", timeout=1.5)
        assert cell["timed_out"] and cell["interrupted"], cell
        assert cell["error"]["ename"] == "KeyboardInterrupt"
        assert time.monotonic() - started < 10
        assert _execute(http, sid, "1 + 1")["result"] == "2"
        http.delete(f"/v1/sessions/{sid}")


BUSY = "open('/workspace/busy', 'w').close()\nwhile True: pass"


def test_interrupt_over_http_stops_while_true_within_2_s_and_the_next_cell_runs(
    server: Server,
) -> None:
    headers = server.tenant("ses-interrupt")
    answered: dict[str, httpx.Response] = {}

    def busy_cell() -> None:
        with httpx.Client(base_url=server.url, headers=headers, timeout=120) as cell_http:
            body = {"code": BUSY, "timeout_s": 120}  # far off: only the interrupt ends it
            answered["cell"] = cell_http.post(f"/v1/sessions/{sid}/execute", json=body)

    with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:
        sid = http.post("/v1/sessions", json={"image": "python-data"}).json()["id"]
        runner = threading.Thread(target=busy_cell, daemon=True)
        runner.start()
        deadline = time.monotonic() + 30
        while http.get(f"/v1/sessions/{sid}/files/busy").status_code != 200:
            assert time.monotonic() < deadline, "the busy cell never started"
            time.sleep(0.05)
        sent = time.monotonic()
        interrupt = http.post(f"/v1/sessions/{sid}/interrupt")
        runner.join(timeout=30)
        took = time.monotonic() - sent
        assert interrupt.status_code == 202 and interrupt.json() == {"interrupted": True}
        assert not runner.is_alive() and took < 2, f"the cell answered {took:.2f} s after"
        cell = answered["cell"]
        assert cell.status_code == 200, cell.text
        assert cell.json()["error"]["ename"] == "KeyboardInterrupt", cell.json()
        assert cell.json()["interrupted"] and not cell.json()["timed_out"]
        assert _execute(http, sid, "1 + 1")["result"] == "2"
        http.delete(f"/v1/sessions/{sid}")


def test_a_pooled_session_pauses_keeping_memory_and_resume_continues(server: Server) -> None:
    with _client(server, "ses-pause") as http:
        sid = _pooled_session(http)
        pooled_sandbox = _sandbox_of(http, sid)
        _execute(http, sid, "x = 41")
        http.put(f"/v1/sessions/{sid}/files/keep.txt", content=b"kept").raise_for_status()
        paused = http.post(f"/v1/sessions/{sid}/pause").json()
        assert paused["state"] == "paused" and paused["memory_kept"] is True
        assert host_processes_mentioning(pooled_sandbox) == []
        resumed = http.post(f"/v1/sessions/{sid}/resume").json()
        assert resumed["state"] == "running" and resumed["pooled"], resumed
        assert resumed["sandbox_id"] != pooled_sandbox  # restored into a new sandbox
        assert _execute(http, sid, "x + 1")["result"] == "42"
        assert http.get(f"/v1/sessions/{sid}/files/keep.txt").content == b"kept"
        http.delete(f"/v1/sessions/{sid}")
        assert host_processes_mentioning(resumed["sandbox_id"]) == []


def test_pooled_sessions_never_see_each_others_variables_or_files(server: Server) -> None:
    with _client(server, "ses-pool-a") as alice, _client(server, "ses-pool-b") as bob:
        first = _pooled_session(alice)
        _execute(alice, first, "secret = 'alice'\nopen('/workspace/a.txt', 'w').write(secret)")
        second = _pooled_session(bob)  # the refill, while alice's session still runs
        seen = _execute(bob, second, "import os\n('secret' in globals(), os.listdir('.'))")
        assert seen["result"] == "(False, [])", seen
        assert _sandbox_of(alice, first) != _sandbox_of(bob, second)
        for http, sid in ((alice, first), (bob, second)):
            sandbox_id = _sandbox_of(http, sid)
            http.delete(f"/v1/sessions/{sid}")
            assert host_processes_mentioning(sandbox_id) == []


def test_preview_url_reaches_a_server_in_the_session_only_with_its_token(server: Server) -> None:
    with _client(server, "ses-preview") as http, _client(server, "ses-other") as other:
        sid = http.post("/v1/sessions", json={"image": "python-data"}).json()["id"]
        _execute(
            http,
            sid,
            "import http.server, threading, os\n"
            "os.makedirs('/workspace/site', exist_ok=True)\n"
            "open('/workspace/site/index.html', 'w').write('hello from the session')\n"
            "os.chdir('/workspace/site')\n"
            "handler = http.server.SimpleHTTPRequestHandler\n"
            "srv = http.server.ThreadingHTTPServer(('127.0.0.1', 8000), handler)\n"
            "threading.Thread(target=srv.serve_forever, daemon=True).start()\n",
        )
        url = http.post(f"/v1/sessions/{sid}/ports/8000/url").json()["url"]
        page = httpx.get(server.url + url + "index.html", timeout=30)
        assert page.status_code == 200 and page.text == "hello from the session"
        assert httpx.get(f"{server.url}/v1/previews/x.8000.1.y/index.html").status_code == 401
        assert other.post(f"/v1/sessions/{sid}/ports/8000/url").status_code == 404
        http.delete(f"/v1/sessions/{sid}")


def test_cells_sent_straight_to_the_worker_share_the_kernel_and_need_the_sessions_token(
    server: Server,
) -> None:
    """One HTTP hop: the client posts the cell to the worker's URL with a token for that
    session only; the kernel, the history and the lifecycle are the API's."""
    with _client(server, "ses-direct") as http, _client(server, "ses-direct-b") as other:
        sid = http.post("/v1/sessions", json={"image": "python-data"}).json()["id"]
        theirs = other.post("/v1/sessions", json={"image": "python-data"}).json()["id"]
        _execute(http, sid, "x = 41")
        access = http.post(f"/v1/sessions/{sid}/direct").json()
        assert access["execute_url"].endswith(f"/direct/sessions/{sid}/execute")
        assert not access["execute_url"].startswith(server.url)  # the worker's own server
        bearer = {"Authorization": f"Bearer {access['token']}"}
        with httpx.Client(headers=bearer, timeout=60) as direct:
            answer = direct.post(access["execute_url"], json={"code": "x + 1"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"] == "42"
            history = http.get(f"/v1/sessions/{sid}/cells").json()["items"]
            assert [cell["code"] for cell in history] == ["x = 41", "x + 1"]
            # The token opens this session's cells only: not another tenant's session.
            stolen = access["execute_url"].replace(sid, theirs)
            assert direct.post(stolen, json={"code": "1"}).status_code == 401
            assert httpx.post(access["execute_url"], json={"code": "1"}).status_code == 401
            paused = http.post(f"/v1/sessions/{sid}/pause").json()
            assert paused["state"] == "paused"
            assert direct.post(access["execute_url"], json={"code": "x"}).status_code == 409
            http.post(f"/v1/sessions/{sid}/resume").raise_for_status()
            again = direct.post(access["execute_url"], json={"code": "x + 2"})
            assert again.status_code == 200 and again.json()["result"] == "43", again.text
            sandbox_id = _sandbox_of(http, sid)
            http.delete(f"/v1/sessions/{sid}").raise_for_status()
            assert direct.post(access["execute_url"], json={"code": "x"}).status_code == 409
        assert host_processes_mentioning(sandbox_id) == []
        other.delete(f"/v1/sessions/{theirs}")


def test_revoking_a_key_ends_the_direct_cells_of_the_tokens_it_minted(server: Server) -> None:
    with httpx.Client(base_url=server.url, headers=server.admin, timeout=60) as admin:
        tenant = admin.post("/v1/admin/tenants", json={"name": "ses-revoked"}).json()
        keys = [admin.post(f"/v1/admin/tenants/{tenant['id']}/keys").json() for _ in "ab"]
        revoked, kept = (
            httpx.Client(
                base_url=server.url, headers={"Authorization": f"Bearer {k['key']}"}, timeout=120
            )
            for k in keys
        )
        with revoked, kept:
            sid = revoked.post("/v1/sessions", json={"image": "python-data"}).json()["id"]
            access = revoked.post(f"/v1/sessions/{sid}/direct").json()
            bearer = {"Authorization": f"Bearer {access['token']}"}

            def cell() -> httpx.Response:
                return httpx.post(access["execute_url"], json={"code": "1"}, headers=bearer)

            assert cell().status_code == 200
            assert admin.delete(f"/v1/admin/keys/{keys[0]['id']}").status_code == 204
            assert revoked.get(f"/v1/sessions/{sid}").status_code == 401  # the API: at once
            deadline = time.monotonic() + 3  # the worker: within its second of staleness
            while (answer := cell()).status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert answer.status_code == 401, answer.text
            assert "revoked" in answer.json()["detail"]
            # The session is the tenant's, not the key's: its other key still runs it.
            assert _execute(kept, sid, "2")["result"] == "2"
            kept.delete(f"/v1/sessions/{sid}").raise_for_status()


def test_an_idle_session_is_stopped_and_its_sandbox_released(server: Server) -> None:
    with _client(server, "ses-idle") as http:
        sid = http.post("/v1/sessions", json={"image": "python-data", "idle_timeout_s": 1}).json()[
            "id"
        ]
        sandbox_id = _sandbox_of(http, sid)
        deadline = time.monotonic() + 30
        while http.get(f"/v1/sessions/{sid}").json()["state"] != "stopped":
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert http.get(f"/v1/sessions/{sid}").json()["reason"] == "idle_timeout"
    assert host_processes_mentioning(sandbox_id) == []


def _stopped(http: httpx.Client, sid: str, within_s: float) -> dict:
    deadline = time.monotonic() + within_s
    while (record := http.get(f"/v1/sessions/{sid}").json())["state"] != "stopped":
        assert time.monotonic() < deadline, record
        time.sleep(0.5)
    return dict(record)


def _at(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_a_session_past_its_ttl_is_stopped_and_its_sandbox_released(server: Server) -> None:
    with _client(server, "ses-ttl") as http:
        # ttl_s only has to be > 0; the idle timeout (default 600 s) stays far off.
        created = http.post("/v1/sessions", json={"image": "python-data", "ttl_s": 3})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        sandbox_id = _sandbox_of(http, sid)
        record = _stopped(http, sid, within_s=30)
        assert record["reason"] == "ttl"
        assert _at(record["stopped_at"]) >= _at(record["expires_at"])
    assert host_processes_mentioning(sandbox_id) == []
    assert not (server.data_dir / "sessions" / sid).exists()


def test_a_paused_session_past_its_ttl_loses_its_checkpoint(server: Server) -> None:
    with _client(server, "ses-ttl-paused") as http:
        # Long enough to start, run a cell and checkpoint before the TTL ends.
        sid = http.post("/v1/sessions", json={"image": "python-data", "ttl_s": 15}).json()["id"]
        sandbox_id = _sandbox_of(http, sid)
        _execute(http, sid, "x = 41")
        paused = http.post(f"/v1/sessions/{sid}/pause").json()
        assert paused["state"] == "paused" and paused["pause_mode"] == "memory", paused
        state_dir = server.data_dir / "sessions" / sid
        assert (state_dir / CHECKPOINT_DIR / CHECKPOINT_FILE).is_file()
        record = _stopped(http, sid, within_s=45)
        assert record["reason"] == "ttl"
        assert not state_dir.exists()  # the checkpoint and the workspace volume with it
        assert http.post(f"/v1/sessions/{sid}/resume").status_code == 409
    assert host_processes_mentioning(sandbox_id) == []


def test_execute_streams_output_as_it_is_produced(server: Server) -> None:
    with _client(server, "ses-stream") as http:
        sid = http.post("/v1/sessions", json={"image": "python-data"}).json()["id"]
        code = "import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')"
        started = time.monotonic()
        arrivals = []
        with http.stream(
            "POST",
            f"/v1/sessions/{sid}/execute",
            json={"code": code},
            headers={"Accept": "text/event-stream"},
        ) as response:
            for line in response.iter_lines():
                if line.startswith("event: "):
                    arrivals.append((line[7:], time.monotonic() - started))
        kinds = [kind for kind, _ in arrivals]
        assert kinds[0] == "stdout" and kinds[-1] == "result"
        assert arrivals[0][1] < arrivals[-1][1] - 1.5  # 'first' came before the cell ended
        http.delete(f"/v1/sessions/{sid}")


def test_a_session_paused_by_a_server_restart_resumes_with_its_memory(
    server: Server, pki: TestPKI, tmp_path_factory: pytest.TempPathFactory
) -> None:
    data_dir = tmp_path_factory.mktemp("restart-data")
    with running_server(data_dir, pki) as first:
        headers = first.tenant("restart")
        with httpx.Client(base_url=first.url, headers=headers, timeout=120) as http:
            sid = _pooled_session(http)
            sandbox_id = _sandbox_of(http, sid)
            _execute(http, sid, "x = 41")
            http.put(f"/v1/sessions/{sid}/files/kept.txt", content=b"kept").raise_for_status()
    # The graceful stop paused (checkpointed) the live session; nothing of it runs now.
    assert host_processes_mentioning(sandbox_id) == []
    # Nor its warm pools' sandboxes and kernels: destroyed, never left running (runsc's
    # command lines name the runtimes' volatile dirs, their other files the data dir).
    for place in (data_dir, *(runtime.run_dir for runtime in _runtimes(data_dir))):
        assert host_processes_mentioning(str(place)) == []
    # Nor the parent cgroups of its runtimes (jobs' and sessions'): each removed its own.
    assert _parent_cgroups(data_dir) == []
    with (
        running_server(data_dir, pki) as second,
        httpx.Client(base_url=second.url, headers=headers, timeout=120) as http,
    ):
        record = http.get(f"/v1/sessions/{sid}").json()
        assert record["state"] == "paused" and record["pause_mode"] == "memory"
        assert http.post(f"/v1/sessions/{sid}/resume").json()["state"] == "running"
        assert _execute(http, sid, "x + 1")["result"] == "42"
        assert http.get(f"/v1/sessions/{sid}/files/kept.txt").content == b"kept"
        http.delete(f"/v1/sessions/{sid}")


def _runtimes(data_dir: Path) -> list[GVisorRuntime]:
    """The server's runtimes on `data_dir` (jobs', sessions'), as seen from outside."""
    return [GVisorRuntime(data_dir / d) for d in ("sandboxes", "session-sandboxes")]


def _parent_cgroups(data_dir: Path) -> list[Path]:
    """The parent cgroups of the server's runtimes on `data_dir` that exist on the host."""
    parents = [runtime.cgroup_parent for runtime in _runtimes(data_dir)]
    found = [Path("/sys/fs/cgroup", c, parent) for parent in parents for c in CONTROLLERS]
    return [path for path in found if path.exists()]


def test_the_session_cli_starts_executes_saves_a_chart_and_stops(
    server: Server, tmp_path: Path
) -> None:
    key = server.tenant("ses-cli")["Authorization"].split()[1]
    env = server.env() | {"SANDCELL_API_KEY": key}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "sandcell.cli.main", "session", *args]
        return subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )

    started = cli("start")
    assert started.returncode == 0, started.stderr
    sid = started.stdout.strip()
    assert cli("exec", sid, "x = 41").returncode == 0
    assert cli("exec", sid, "x + 1").stdout.strip() == "42"
    chart = cli("exec", sid, "import matplotlib.pyplot as plt; plt.plot([1, 3, 2]); plt.show()")
    assert chart.returncode == 0, chart.stderr
    assert (tmp_path / "image-0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    paused = cli("pause", sid, "--json")
    assert paused.returncode == 0, paused.stderr
    assert json.loads(paused.stdout)["pause_mode"] == "memory"
    resumed = cli("resume", sid, "--json")
    assert resumed.returncode == 0 and json.loads(resumed.stdout)["state"] == "running"
    assert cli("exec", sid, "x + 1").stdout.strip() == "42"  # memory kept across the pause
    failed = cli("exec", sid, "1 / 0")
    assert failed.returncode == 1 and "ZeroDivisionError" in failed.stderr
    history = json.loads(cli("cells", sid, "--json").stdout)
    assert [c["code"] for c in history][:2] == ["x = 41", "x + 1"]
    assert history[-1]["error"]["ename"] == "ZeroDivisionError"
    shown = cli("cells", sid, "--after", "1", "--limit", "1")
    assert shown.returncode == 0 and "x + 1" in shown.stdout and "42" in shown.stdout
    assert json.loads(cli("stop", sid, "--json").stdout)["state"] == "stopped"
