"""Client commands: `sandcell run` and `sandcell jobs …`, over the SDK."""

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from sandcell_client import ApiError, Client

client_app = typer.Typer(no_args_is_help=True, help="List, inspect, cancel and retire jobs.")
T = TypeVar("T")
console = Console()
err = Console(stderr=True)
# Guest output may carry escape sequences; a terminal must never interpret them.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

Url = Annotated[str, typer.Option(envvar="SANDCELL_URL", help="server URL")]
Key = Annotated[str, typer.Option(envvar="SANDCELL_API_KEY", help="tenant API key")]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable output")]


def safe(text: str) -> str:
    return CONTROL.sub("\ufffd", text)


def _client(url: str, key: str) -> Client:
    if not key:
        err.print("[red]error:[/red] set SANDCELL_API_KEY or pass --key")
        raise typer.Exit(2)
    return Client(url, key)


def _fail(exc: ApiError) -> typer.Exit:
    err.print(f"[red]error:[/red] {safe(str(exc))}")
    return typer.Exit(1)


def call(action: Callable[[], T]) -> T:
    """Run one API call; a problem answer becomes a clear line and exit status 1."""
    try:
        return action()
    except ApiError as exc:
        raise _fail(exc) from exc


def run_command(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Python file to run")],
    input: Annotated[
        list[Path] | None, typer.Option("--input", exists=True, dir_okay=False)
    ] = None,
    allow: Annotated[
        list[str] | None, typer.Option("--allow", help="host the job may reach")
    ] = None,
    image: Annotated[str | None, typer.Option()] = None,
    timeout: Annotated[float | None, typer.Option(help="wall clock seconds")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait")] = True,
    out: Annotated[Path, typer.Option(help="where artifacts are downloaded")] = Path(
        "sandcell-output"
    ),
    url: Url = "http://127.0.0.1:8080",
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Submit FILE as a job; with --wait show progress, print logs, download artifacts."""
    try:
        with _client(url, key) as client:
            job = _submit(client, file, input or [], allow or [], image, timeout)
            if not wait:
                _emit(job, as_json)
                return
            with err.status(f"job {job['id']} {job['state']}…"):
                job = client.wait(job["id"])
            logs = client.logs(job["id"])
            sys.stdout.write(safe(logs["stdout"]))
            sys.stderr.write(safe(logs["stderr"]))
            for output in job["outputs"]:
                path = client.download(output["artifact_id"], out / job["id"] / output["path"])
                err.print(
                    f"downloaded {safe(output['path'])} → {path} (sha256 {output['sha256'][:12]}…)"
                )
    except ApiError as exc:
        raise _fail(exc) from exc
    _emit(job, as_json) if as_json else err.print(_summary(job))
    raise typer.Exit(0 if job["state"] == "completed" else 1)


def _submit(
    client: Client,
    file: Path,
    inputs: list[Path],
    allow: list[str],
    image: str | None,
    timeout: float | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"code": file.read_text()}
    refs = []
    for path in inputs:
        with path.open("rb") as content:
            stored = client.upload(path.name, content)
        refs.append({"file_id": stored["id"], "path": path.name})
    body["inputs"] = refs
    if allow:
        body["network"] = {"allow": allow}
    if image:
        body["image"] = image
    if timeout:
        body["limits"] = {"timeout_s": timeout}
    return client.submit(body)


def _summary(job: dict[str, Any]) -> str:
    reason = f" ({job['reason']})" if job.get("reason") else ""
    return f"job {job['id']}: {job['state']}{reason} in {job.get('run_ms')} ms"


def _emit(data: Any, as_json: bool) -> None:
    if as_json:
        console.print_json(json.dumps(data))
    else:
        console.print(data)


@client_app.command("list")
def jobs_list(
    state: str | None = None,
    url: Url = "http://127.0.0.1:8080",
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """List your jobs, newest first."""
    page = call(lambda: _client(url, key).jobs(state=state))
    if as_json:
        _emit(page, True)
        return
    table = Table("id", "state", "reason", "accepted_at", "run_ms")
    for job in page["items"]:
        table.add_row(
            job["id"], job["state"], job["reason"] or "", job["accepted_at"], str(job["run_ms"])
        )
    console.print(table)


@client_app.command("show")
def jobs_show(job_id: str, url: Url = "http://127.0.0.1:8080", key: Key = "") -> None:
    """Show one job record."""
    _emit(call(lambda: _client(url, key).job(job_id)), True)


@client_app.command("logs")
def jobs_logs(
    job_id: str, follow: bool = False, url: Url = "http://127.0.0.1:8080", key: Key = ""
) -> None:
    """Print a job's stdout and stderr (--follow streams them)."""
    client = _client(url, key)
    try:
        if follow:
            for event, data in client.stream_logs(job_id):
                if event in ("stdout", "stderr"):
                    stream = sys.stdout if event == "stdout" else sys.stderr
                    stream.write(safe(json.loads(data)))
                    stream.flush()
            return
        logs = client.logs(job_id)
    except ApiError as exc:
        raise _fail(exc) from exc
    sys.stdout.write(safe(logs["stdout"]))
    sys.stderr.write(safe(logs["stderr"]))


@client_app.command("cancel")
def jobs_cancel(job_id: str, url: Url = "http://127.0.0.1:8080", key: Key = "") -> None:
    """Cancel a job (it is cancelled once the sandbox is verified gone)."""
    _emit(call(lambda: _client(url, key).cancel(job_id)), True)


@client_app.command("retire")
def jobs_retire(job_id: str, url: Url = "http://127.0.0.1:8080", key: Key = "") -> None:
    """Retire a finished job now and print the deletion report."""
    _emit(call(lambda: _client(url, key).retire(job_id)), True)
