"""The client CLI against a real `sandcell serve`: live logs, --json for scripts, clear errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.gvisor
CLI = [sys.executable, "-m", "sandcell.cli.main"]
SLOW = "import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')\n"


def _env(server: Server, name: str) -> dict[str, str]:
    key = server.tenant(name)["Authorization"].split()[1]
    return server.env() | {"SANDCELL_API_KEY": key}


def test_run_streams_logs_live_and_json_is_for_scripts(server: Server, tmp_path: Path) -> None:
    env = _env(server, "cli-stream")
    (tmp_path / "slow.py").write_text(SLOW)
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
        [*CLI, "run", "slow.py", "--json", "--out", "out"],
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
    assert [e["text"] for e in events if e["kind"] == "stdout"] == ["first\n", "second\n"]
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
