"""Local commands print machine-readable JSON with --json, like every client command."""

import json
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
