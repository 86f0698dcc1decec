"""What the CLI shows people: the progress of `sandcell run`, and hints that can be pasted."""

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.cli import client as cli_client
from sandcell.cli.main import api_key_hint, invocation
from sandcell.settings import Settings
from sandcell_client import Job, LogEvent

VENV_SANDCELL = Path(sys.executable).parent / "sandcell"


class Spinner:
    """Stands in for rich's status: records each text it is asked to show."""

    def __init__(self, text: str) -> None:
        self.texts = [text]

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def update(self, text: str) -> None:
        self.texts.append(text)


class ScriptedServer:
    """The job records a long-poll answers in turn, then the log stream."""

    def __init__(self, states: list[str], events: list[LogEvent]) -> None:
        self.states, self.events, self.waits = states, events, list[float]()

    def job(self, job_id: str, wait: float = 0) -> Job:
        self.waits.append(wait)
        return Job(id=job_id, state=self.states.pop(0))

    def wait(self, job_id: str) -> Job:
        return Job(id=job_id, state=self.states[-1])

    def stream_logs(self, job_id: str) -> Iterator[LogEvent]:
        yield from self.events


@pytest.fixture
def spinners(monkeypatch: pytest.MonkeyPatch) -> list[Spinner]:
    made: list[Spinner] = []

    def status(text: str) -> Spinner:
        made.append(Spinner(text))
        return made[-1]

    monkeypatch.setattr(cli_client.err, "status", status)
    return made


def test_run_shows_the_state_as_it_changes_then_the_output(
    spinners: list[Spinner], capsys: pytest.CaptureFixture[str]
) -> None:
    events = [LogEvent(kind="stdout", text="total 6\n", seq=0), LogEvent(kind="end")]
    server = ScriptedServer(["accepted", "running", "completed"], events)
    done = cli_client._follow(server, Job(id="job_1", state="accepted"), live=True)
    assert done.state == "completed" and capsys.readouterr().out == "total 6\n"
    [spinner] = spinners
    assert spinner.texts == [
        "job job_1 accepted: waiting for a sandbox…",
        "job job_1 accepted: waiting for a sandbox…",
        "job job_1 running…",
    ]
    # Short polls while it waits for a sandbox; the live stream from the moment it runs.
    assert server.waits == [cli_client.STATE_POLL_S] * 2


def test_run_json_follows_the_state_with_long_polls_once_running(
    spinners: list[Spinner],
) -> None:
    server = ScriptedServer(["running", "running", "failed"], [])
    done = cli_client._follow(server, Job(id="job_2", state="accepted"), live=False)
    assert done.state == "failed"
    assert spinners[0].texts[-3:] == [
        "job job_2 running…",
        "job job_2 running…",
        "job job_2 failed",
    ]
    assert server.waits == [cli_client.STATE_POLL_S, cli_client.LONG_POLL_S, cli_client.LONG_POLL_S]


def test_the_invocation_is_the_running_program_not_a_bare_name(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".venv/bin").mkdir(parents=True)
    (tmp_path / ".venv/bin/sandcell").write_text("#!/bin/sh\n")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setattr(sys, "argv", [".venv/bin/sandcell", "serve"])
    assert invocation() == str(tmp_path / ".venv/bin/sandcell")
    monkeypatch.setenv("PATH", f"{tmp_path / '.venv/bin'}:/usr/bin")
    (tmp_path / ".venv/bin/sandcell").chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / ".venv/bin/sandcell"), "serve"])
    assert invocation() == "sandcell"  # on PATH, the short name finds this very program
    monkeypatch.setattr(sys, "argv", ["/src/sandcell/cli/main.py", "serve"])
    assert invocation() == f"{shlex.quote(sys.executable)} -m sandcell.cli.main"


def test_the_api_key_hint_can_be_pasted_into_a_shell(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if not VENV_SANDCELL.exists():
        pytest.skip("no sandcell entry point beside this interpreter")
    monkeypatch.setattr(sys, "argv", [str(VENV_SANDCELL), "serve"])
    hint = api_key_hint(Settings(data_dir=tmp_path / "data"))
    create_tenant, create_key = hint.split("`")[1::2][:2]
    assert create_tenant.endswith(" admin create-tenant NAME")
    # Pasted elsewhere, in a shell that knows neither PATH to the venv nor the data dir.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDCELL_")}
    env |= {"PATH": "/usr/bin:/bin"}
    pasted = subprocess.run(
        ["sh", "-c", create_tenant.replace("NAME", "demo") + " --json"],
        cwd="/", env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    tenant = json.loads(pasted.stdout)
    assert tenant["name"] == "demo" and tenant["id"].startswith("ten_")
    program = create_tenant.removesuffix(" admin create-tenant NAME")
    assert create_key == f"{program} admin create-key --tenant ID"  # the e2e tests run that one
