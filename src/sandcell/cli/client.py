"""Client commands: `sandcell run` and `sandcell jobs …`, over the SDK."""

import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TransferSpeedColumn,
)
from rich.status import Status
from rich.table import Table

from sandcell_client import (
    ApiError,
    Client,
    Job,
    Output,
    SandcellError,
    TransportError,
    Unauthorized,
)
from sandcell_client._base import LONG_POLL_S, job_body, safe_destination

client_app = typer.Typer(no_args_is_help=True, help="List, inspect, cancel and retire jobs.")
T = TypeVar("T")
console = Console()
err = Console(stderr=True)
# Guest output may carry escape sequences; a terminal must never interpret them.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

Url = Annotated[
    str, typer.Option(envvar="SANDCELL_URL", help="server URL (SANDCELL_URL)", show_default=True)
]
Key = Annotated[
    str, typer.Option(envvar="SANDCELL_API_KEY", help="tenant API key (SANDCELL_API_KEY)")
]
AsJson = Annotated[bool, typer.Option("--json", help="machine-readable output on stdout")]
DEFAULT_URL = "http://127.0.0.1:8080"
STATE_POLL_S = 0.5
"""How long a long-poll lasts while a job waits for a sandbox: how late `running` may show."""


def safe(text: str) -> str:
    return CONTROL.sub("\ufffd", text)


def _client(url: str, key: str) -> Client:
    if not key:
        err.print("[red]error:[/red] set SANDCELL_API_KEY or pass --key")
        raise typer.Exit(2)
    return Client(url, key)


def describe(exc: SandcellError, url: str | None = None) -> str:
    """One line a person can act on."""
    text = safe(str(exc))
    if isinstance(exc, TransportError):
        return f"cannot reach sandcell{f' at {url}' if url else ''}: {text}"
    if isinstance(exc, Unauthorized):
        return f"{text} — check SANDCELL_API_KEY (or --key)"
    if isinstance(exc, ApiError) and exc.retry_after:
        return f"{text} (retry after {exc.retry_after:g} s)"
    return text


def _fail(exc: SandcellError, url: str | None = None) -> typer.Exit:
    err.print(f"[red]error:[/red] {describe(exc, url)}", highlight=False)
    return typer.Exit(1)


def call(action: Callable[[], T], url: str | None = None) -> T:
    """Run one API call; an error answer or an unreachable server becomes a clear line and
    exit status 1, never a traceback."""
    try:
        return action()
    except SandcellError as exc:
        raise _fail(exc, url) from exc


def jsonable(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list | tuple):
        return [jsonable(item) for item in data]
    if isinstance(data, dict):
        return {k: jsonable(v) for k, v in data.items()}
    if isinstance(data, Path):
        return str(data)
    return data


def _emit(data: Any, as_json: bool = True) -> None:
    if as_json:
        print(json.dumps(jsonable(data), indent=2))
    else:
        console.print(jsonable(data))


@contextmanager
def transfer(label: str, total: int | None) -> Iterator[Callable[[int, int | None], None]]:
    """A progress bar on stderr for an upload or a download (only on a terminal: elsewhere
    it would leave an empty line behind)."""
    if not err.is_terminal:
        yield lambda done, size: None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task(safe(label), total=total)

        def report(done: int, size: int | None) -> None:
            progress.update(task, completed=done, total=size or total)

        yield report


def run_command(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Python file to run")],
    input: Annotated[
        list[Path] | None,
        typer.Option("--input", exists=True, dir_okay=False, help="file placed under /input"),
    ] = None,
    allow: Annotated[
        list[str] | None, typer.Option("--allow", help="host the job may reach")
    ] = None,
    image: Annotated[str | None, typer.Option(help="python or python-data")] = None,
    timeout: Annotated[float | None, typer.Option(help="wall clock seconds")] = None,
    memory: Annotated[int | None, typer.Option(help="memory limit in MB")] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="follow the job to its end")
    ] = True,
    out: Annotated[Path, typer.Option(help="where artifacts are downloaded")] = Path(
        "sandcell-output"
    ),
    url: Url = DEFAULT_URL,
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Submit FILE as a job; with --wait stream its logs live and download its artifacts."""
    client = _client(url, key)
    with client:
        inputs = call(lambda: [_upload(client, path) for path in input or []], url)
        limits = {"timeout_s": timeout, "memory_mb": memory}
        body = job_body(file.read_text(), inputs=inputs, image=image, allow=allow, limits=limits)
        job = call(lambda: client.submit(body), url)
        if not wait:
            _emit(job) if as_json else print(job.id)
            return
        job = call(lambda: _follow(client, job, live=not as_json), url)
        paths = call(lambda: _download_all(client, job, out), url)
    if as_json:
        _emit({"job": job, "artifacts": [str(p) for p in paths]})
    else:
        err.print(_summary(job), highlight=False, soft_wrap=True)
    raise typer.Exit(0 if job.state == "completed" else 1)


def _upload(client: Client, path: Path) -> dict[str, str]:
    with transfer(f"upload {path.name}", path.stat().st_size) as report:
        stored = client.upload(path.name, path, on_progress=report)
    return {"file_id": stored.id, "path": path.name}


def _follow(client: Client, job: Job, live: bool) -> Job:
    """Until the job ends: a spinner that names its state as it changes, then (live) its
    output as it is printed."""
    status = err.status(_progress(job))
    status.start()
    try:
        # A long-poll answers as soon as the job ends; while the job waits for a sandbox it
        # is kept short, so the spinner (and the live output after it) follows the start.
        while not job.terminal and not (live and job.state != "accepted"):
            wait = STATE_POLL_S if job.state == "accepted" else LONG_POLL_S
            job = client.job(job.id, wait=wait)
            status.update(_progress(job))
        if live:
            _print_live(client, job.id, status)
    finally:
        status.stop()
    return job if job.terminal else client.wait(job.id)


def _progress(job: Job) -> str:
    if job.state == "accepted":
        return f"job {job.id} accepted: waiting for a sandbox…"
    return f"job {job.id} {job.state}" + ("" if job.terminal else "…")


def _print_live(client: Client, job_id: str, status: Status) -> None:
    for event in client.stream_logs(job_id):
        status.stop()  # the first output replaces the spinner
        if event.kind in ("stdout", "stderr"):
            stream = sys.stdout if event.kind == "stdout" else sys.stderr
            stream.write(safe(event.text))
            stream.flush()


def _download_all(client: Client, job: Job, out: Path) -> list[Path]:
    paths = []
    for output in job.outputs:
        paths.append(_download(client, output, safe_destination(out / job.id, output.path)))
    return paths


def _download(client: Client, output: Output, dest: Path) -> Path:
    with transfer(f"download {output.path}", output.size) as report:
        path = client.download(output, dest, on_progress=report)
    err.print(  # one line, however long the path: it is meant to be copied
        f"downloaded {safe(output.path)} → {path} (sha256 {output.sha256[:12]}… verified)",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    return path


def _summary(job: Job) -> str:
    reason = f" ({job.reason})" if job.reason else ""
    return f"job {job.id}: {job.state}{reason} in {job.run_ms} ms"


@client_app.command("list")
def jobs_list(
    state: Annotated[str | None, typer.Option(help="accepted, running, completed, …")] = None,
    limit: Annotated[int, typer.Option(help="at most this many")] = 50,
    url: Url = DEFAULT_URL,
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """List your jobs, newest first."""
    page = call(lambda: _client(url, key).jobs(state=state, limit=limit), url)
    if as_json:
        _emit(page)
        return
    table = Table("id", "state", "reason", "accepted_at", "run_ms")
    for job in page.items:
        table.add_row(job.id, job.state, job.reason or "", job.accepted_at, str(job.run_ms))
    console.print(table)


@client_app.command("show")
def jobs_show(job_id: str, url: Url = DEFAULT_URL, key: Key = "", as_json: AsJson = False) -> None:
    """Show one job record."""
    _emit(call(lambda: _client(url, key).job(job_id), url), as_json)


@client_app.command("logs")
def jobs_logs(
    job_id: str,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="stream until it ends")] = False,
    url: Url = DEFAULT_URL,
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Print a job's stdout and stderr (--follow streams them; --json: one event per line)."""
    client = _client(url, key)
    if follow:
        call(lambda: _stream(client, job_id, as_json), url)
        return
    logs = call(lambda: client.logs(job_id), url)
    if as_json:
        _emit(logs)
        return
    sys.stdout.write(safe(logs.stdout))
    sys.stderr.write(safe(logs.stderr))


def _stream(client: Client, job_id: str, as_json: bool) -> None:
    for event in client.stream_logs(job_id):
        if as_json:
            print(event.model_dump_json(exclude_none=True), flush=True)
        elif event.kind in ("stdout", "stderr"):
            stream = sys.stdout if event.kind == "stdout" else sys.stderr
            stream.write(safe(event.text))
            stream.flush()


@client_app.command("cancel")
def jobs_cancel(
    job_id: str, url: Url = DEFAULT_URL, key: Key = "", as_json: AsJson = False
) -> None:
    """Cancel a job (it is cancelled once the sandbox is verified gone)."""
    job = call(lambda: _client(url, key).cancel(job_id), url)
    _emit(job) if as_json else print(f"{job.id}: {job.state} (cancel requested)")


@client_app.command("retire")
def jobs_retire(
    job_id: str, url: Url = DEFAULT_URL, key: Key = "", as_json: AsJson = False
) -> None:
    """Retire a finished job now and print the deletion report."""
    _emit(call(lambda: _client(url, key).retire(job_id), url), as_json)


@client_app.command("download")
def jobs_download(
    job_id: str,
    out: Annotated[Path, typer.Option(help="directory for the artifacts")] = Path(
        "sandcell-output"
    ),
    url: Url = DEFAULT_URL,
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Download a job's artifacts (each checked against its sha256)."""
    client = _client(url, key)
    job = call(lambda: client.job(job_id), url)
    paths = call(lambda: _download_all(client, job, out), url)
    _emit([str(p) for p in paths]) if as_json else None
