"""`sandcell serve` when it cannot do its job: it says why in one line and exits, instead of
printing a traceback or staying up with an API that never becomes ready."""

import os
import socket
import subprocess
import sys
from pathlib import Path

SERVE = [sys.executable, "-m", "sandcell.cli.main", "serve"]
NO_POOLS = {"SANDCELL_POOL_SIZE": "0", "SANDCELL_SESSION_POOL_SIZE": "0"}


def _serve(data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    full_env = os.environ | {"SANDCELL_DATA_DIR": str(data_dir), "SANDCELL_PORT": str(port)}
    return subprocess.run(SERVE, env=full_env | env, capture_output=True, text=True, timeout=90)


def _said(done: subprocess.CompletedProcess[str]) -> str:
    """What serve told a person: stderr without its JSON log lines."""
    return "\n".join(line for line in done.stderr.splitlines() if not line.startswith("{"))


def test_a_malformed_setting_stops_serve_with_one_clear_line(tmp_path: Path) -> None:
    done = _serve(tmp_path, SANDCELL_POOL_SIZE="python")
    assert done.returncode == 2
    said = _said(done)
    assert "configuration: SANDCELL_POOL_SIZE: " in said and "is not IMAGE=COUNT" in said
    assert "Traceback" not in done.stderr and "╭" not in done.stderr


def test_serve_exits_when_its_worker_cannot_start(tmp_path: Path) -> None:
    with socket.socket() as taken:  # the worker's internal endpoint cannot bind here
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        done = _serve(tmp_path, SANDCELL_WORKER_LISTEN=listen, **NO_POOLS)
    assert done.returncode == 1
    said = _said(done)
    assert f"SANDCELL_WORKER_LISTEN={listen}: Address already in use" in said
    assert said.splitlines()[-1] == "sandcell serve: the worker exited with status 1"
    assert "Traceback" not in done.stderr and "╭" not in done.stderr
