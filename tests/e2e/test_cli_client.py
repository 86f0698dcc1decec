"""The client CLI against a real `sandcell serve`: live logs, --json for scripts, clear errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.gvisor
CLI = [sys.executable, "-m", "sandcell.cli.main"]
# Long enough for `sandcell jobs list` to start and answer while the job sleeps: the CLI's
# own start alone took 2.3-2.6 s on a busy VM of this kind.
SLOW = "import time\nprint('first', flush=True)\ntime.sleep(8)\nprint('second')\n"
QUICK = "print('first', flush=True)\nprint('second')\n"


def _env(server: Server, name: str) -> dict[str, str]:
    key = server.tenant(name)["Authorization"].split()[1]
    return server.env() | {"SANDCELL_API_KEY": key}


def test_run_streams_logs_live_and_json_is_for_scripts(server: Server, tmp_path: Path) -> None:
    env = _env(server, "cli-stream")
    (tmp_path / "slow.py").write_text(SLOW)
    (tmp_path / "quick.py").write_text(QUICK)
    with subprocess.Popen(
        [*CLI, "run", "slow.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    ) as run:
        assert run.stdout is not None
        assert run.stdout.readline() == "first\n"  # printed while the job still sleeps
        listed = subprocess.run(
            [*CLI, "jobs", "list", "--json"], env=env, capture_output=True, text=True, check=True
        )
        assert [job["state"] for job in json.loads(listed.stdout)["items"]] == ["running"]
        assert run.stdout.read() == "second\n" and run.wait(60) == 0

    done = subprocess.run(
        [*CLI, "run", "quick.py", "--json", "--out", "out"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["job"]["state"] == "completed" and answer["artifacts"] == []
    follow = subprocess.run(
        [*CLI, "jobs", "logs", answer["job"]["id"], "--follow", "--json"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    events = [json.loads(line) for line in follow.stdout.splitlines()]
    assert "".join(e["text"] for e in events if e["kind"] == "stdout") == "first\nsecond\n"
    assert events[-1] == {"kind": "end", "text": "", "state": "completed"}


def test_errors_are_one_clear_line(server: Server) -> None:
    env = _env(server, "cli-errors")
    missing = subprocess.run(
        [*CLI, "jobs", "show", "job_nope"], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 1 and missing.stderr.startswith("error: 404")
    assert "Traceback" not in missing.stderr
    down = env | {"SANDCELL_URL": "http://127.0.0.1:9"}
    refused = subprocess.run([*CLI, "jobs", "list"], env=down, capture_output=True, text=True)
    assert (
        refused.returncode == 1 and "cannot reach sandcell at http://127.0.0.1:9" in refused.stderr
    )
    bad_key = env | {"SANDCELL_API_KEY": "sc_wrong"}
    denied = subprocess.run([*CLI, "jobs", "list"], env=bad_key, capture_output=True, text=True)
    assert denied.returncode == 1 and "check SANDCELL_API_KEY" in denied.stderr


def test_admin_commands_make_a_tenant_key_that_works_until_revoked(server: Server) -> None:
    env = server.env()  # the server's data dir: admin commands work on this host's store

    def admin(*args: str) -> dict:
        done = subprocess.run(
            [*CLI, "admin", *args, "--json"], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    # The tenant: with the command `serve` printed, pasted as is into a plain shell.
    [hint] = {line for line in (server.data_dir / "serve.log").read_text().splitlines()
              if line.startswith("API key: ")}  # fmt: skip
    create_tenant = hint.split("`")[1].replace("NAME", "cli-admin") + " --json"
    plain = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    pasted = subprocess.run(
        ["sh", "-c", create_tenant], env=plain, cwd="/", capture_output=True, text=True, timeout=60
    )
    assert pasted.returncode == 0, (create_tenant, pasted.stderr)
    tenant = json.loads(pasted.stdout)
    assert tenant["name"] == "cli-admin" and tenant["id"].startswith("ten_")
    key = admin("create-key", "--tenant", tenant["id"])
    assert key["tenant_id"] == tenant["id"] and key["key"].startswith(f"sc_{key['id']}_")
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {key['key']}"}
    ) as http:
        stored = http.post("/v1/files", files={"file": ("a.csv", b"x\n")})
        assert stored.status_code == 201
        assert http.get("/v1/jobs").json()["items"] == []  # a new tenant's own, empty list
        assert http.post("/v1/admin/tenants", json={"name": "x"}).status_code == 403
        assert admin("revoke-key", key["id"]) == {"id": key["id"], "revoked": True}
        refused = http.get(f"/v1/files/{stored.json()['id']}")  # at once: no retry, no wait
    assert refused.status_code == 401, refused.text
    assert refused.headers["content-type"] == "application/problem+json"
    assert refused.json()["detail"] == "this API key was revoked"
    again = subprocess.run(
        [*CLI, "admin", "revoke-key", key["id"]], env=env, capture_output=True, text=True
    )
    assert again.returncode == 1 and "no such active key" in again.stderr
    assert "Traceback" not in again.stderr
