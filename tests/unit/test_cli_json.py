"""Local commands print machine-readable JSON with --json, like every client command."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sandcell import __version__
from sandcell.cli.main import app

BUILT = Path("/var/lib/sandcell/images")


def test_version_json() -> None:
    answer = CliRunner().invoke(app, ["version", "--json"])
    assert answer.exit_code == 0 and json.loads(answer.stdout) == {"version": __version__}


def test_image_list_json_names_each_built_image_with_its_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDCELL_IMAGE_DIR", str(tmp_path))
    empty = CliRunner().invoke(app, ["image", "list", "--json"])
    assert empty.exit_code == 0 and json.loads(empty.stdout) == []
    if not (BUILT / "python").is_dir():
        pytest.skip("the python image is not built here")
    monkeypatch.setenv("SANDCELL_IMAGE_DIR", str(BUILT))
    built = {
        i["name"]: i
        for i in json.loads(CliRunner().invoke(app, ["image", "list", "--json"]).stdout)
    }
    assert built["python"]["digest"].startswith("sha256:") and built["python"]["version"]


def test_admin_set_quotas_changes_resets_and_refuses_like_the_api(tmp_path: Path) -> None:
    env = os.environ | {"SANDCELL_DATA_DIR": str(tmp_path)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "sandcell.cli.main", "admin", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    created = cli("create-tenant", "quota-cli")
    assert created.returncode == 0, created.stderr
    tenant_id = json.loads(created.stdout)["id"]
    changed = cli("set-quotas", tenant_id, "--json", "--sessions", "3", "--jobs-per-minute", "2.5")
    assert changed.returncode == 0, changed.stderr
    answer = json.loads(changed.stdout)
    assert answer["quota_overrides"] == {"sessions": 3, "jobs_per_minute": 2.5}
    assert answer["quotas"]["sessions"] == 3 and answer["quotas"]["burst"] == 60
    reset = json.loads(cli("set-quotas", tenant_id, "--json", "--reset", "sessions").stdout)
    assert reset["quota_overrides"] == {"jobs_per_minute": 2.5}
    refused = cli("set-quotas", tenant_id, "--sessions", "-1")
    assert refused.returncode == 2 and "--sessions" in refused.stderr
    assert cli("set-quotas", tenant_id, "--reset", "gpus").returncode == 2
    unknown = cli("set-quotas", "ten_nope", "--sessions", "1")
    assert unknown.returncode == 1 and "no such tenant" in unknown.stderr
