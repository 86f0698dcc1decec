"""`sandcell session …`: a stateful interpreter from the command line, over the SDK."""

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from sandcell.cli.client import (
    DEFAULT_URL,
    AsJson,
    Key,
    Url,
    _client,
    _emit,
    call,
    console,
    err,
    safe,
)
from sandcell_client import Cell, CellRecord, Client, Session, SessionInfo

session_app = typer.Typer(no_args_is_help=True, help="Stateful interpreter sessions.")


def _session(client: Client, session_id: str) -> Session:
    return client.sessions.attach(session_id)


@session_app.command("start")
def start(
    image: Annotated[str | None, typer.Option()] = None,
    allow: Annotated[list[str] | None, typer.Option("--allow")] = None,
    url: Url = DEFAULT_URL,
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Start a session; prints its id."""
    client = _client(url, key)
    with err.status("starting a session sandbox…"):
        session = call(lambda: client.sessions.create(image=image, allow=allow), url)
    _emit(session.info) if as_json else print(session.id)


@session_app.command("exec")
def execute(
    session_id: str,
    code: Annotated[str | None, typer.Argument(help="code; '-' or omitted reads stdin")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", exists=True)] = None,
    timeout: float = 60,
    images: Annotated[Path, typer.Option(help="where image/png outputs are saved")] = Path("."),
    url: Url = DEFAULT_URL,
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Run one cell and show its output; PNG displays are saved as files."""
    source = file.read_text() if file else (sys.stdin.read() if code in (None, "-") else code)
    session = _session(_client(url, key), session_id)
    if as_json:
        result = call(lambda: session.execute(source or "", timeout), url)
        _emit(result)
    else:
        result = call(lambda: _stream(session, source or "", timeout), url)
        _show(result, images)
    if result.error:
        raise typer.Exit(1)


def _stream(session: Session, code: str, timeout: float) -> Cell:
    """Print the cell's stdout/stderr as it comes; answer the whole cell at the end."""
    for event in session.execute_stream(code, timeout):
        if event.type in ("stdout", "stderr"):
            stream = sys.stdout if event.type == "stdout" else sys.stderr
            stream.write(safe(event.text))
            stream.flush()
        elif event.cell is not None:
            return event.cell
    raise AssertionError("execute_stream ends with its result")


def _show(result: Cell, images: Path) -> None:
    pngs = 0
    for item in result.display:
        if item.mime == "image/png":
            path = images / f"image-{pngs}.png"
            pngs += 1
            path.write_bytes(item.content())
            err.print(f"[image/png saved to {path}]")
        elif item.mime == "text/plain":
            print(safe(item.data))
    if result.result is not None:
        print(safe(result.result))
    if result.error:
        error = result.error
        err.print(safe("\n".join(error.traceback) or f"{error.ename}: {error.evalue}"))


def _show_record(info: SessionInfo, as_json: bool) -> None:
    if as_json:
        _emit(info)
        return
    mode = f", {info.pause_mode} kept" if info.pause_mode and info.state == "paused" else ""
    print(f"{info.id}: {info.state}{mode}")


@session_app.command("list")
def list_sessions(
    live: Annotated[bool, typer.Option(help="only running or paused")] = False,
    url: Url = DEFAULT_URL,
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """List your sessions."""
    found = call(lambda: _client(url, key).sessions.list(live=live), url)
    if as_json:
        _emit(found)
        return
    table = Table("id", "state", "image", "executions", "expires_at")
    for info in found:
        table.add_row(info.id, info.state, info.image, str(info.executions), info.expires_at)
    console.print(table)


@session_app.command("cells")
def cells(
    session_id: str,
    after: Annotated[int | None, typer.Option(help="only cells numbered above this")] = None,
    limit: Annotated[int, typer.Option(min=1, max=100)] = 20,
    url: Url = DEFAULT_URL,
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Show the session's recent cells: kept on the server, also after it paused or stopped."""
    found = call(lambda: _session(_client(url, key), session_id).cells(after, limit), url)
    if as_json:
        _emit(found)
        return
    for cell in found:
        _show_history(cell)


def _show_history(cell: CellRecord) -> None:
    took = f"{cell.duration_ms:.0f} ms" if cell.duration_ms is not None else ""
    console.rule(f"[{cell.seq}] {cell.started_at or ''} {took}", align="left", style="dim")
    console.print(safe(cell.code), markup=False, highlight=False, style="cyan")
    if cell.stdout:
        print(safe(cell.stdout), end="" if cell.stdout.endswith("\n") else "\n")
    if cell.stderr:
        err.print(safe(cell.stderr), markup=False, highlight=False, end="")
    for item in cell.display:
        print(safe(item.data) if item.mime == "text/plain" else f"[{item.mime} output]")
    if cell.result is not None:
        print(safe(cell.result))
    if cell.error:
        err.print(safe(f"{cell.error.ename}: {cell.error.evalue}"), markup=False, highlight=False)
    if cell.truncated:
        err.print("[output truncated]", markup=False, style="dim")


@session_app.command("pause")
def pause(session_id: str, url: Url = DEFAULT_URL, key: Key = "", as_json: AsJson = False) -> None:
    """Pause: keep the workspace and, with gVisor, process memory."""
    with err.status(f"checkpointing {session_id}…"):
        info = call(lambda: _session(_client(url, key), session_id).pause(), url)
    _show_record(info, as_json)


@session_app.command("resume")
def resume(session_id: str, url: Url = DEFAULT_URL, key: Key = "", as_json: AsJson = False) -> None:
    """Resume a paused session."""
    with err.status(f"restoring {session_id}…"):
        info = call(lambda: _session(_client(url, key), session_id).resume(), url)
    _show_record(info, as_json)


@session_app.command("stop")
def stop(session_id: str, url: Url = DEFAULT_URL, key: Key = "", as_json: AsJson = False) -> None:
    """Stop a session and release its sandbox."""
    _show_record(call(lambda: _session(_client(url, key), session_id).stop(), url), as_json)


@session_app.command("upload")
def upload(
    session_id: str,
    local: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    remote: str,
    url: Url = DEFAULT_URL,
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Copy a local file to /workspace/REMOTE."""
    session = _session(_client(url, key), session_id)
    with err.status(f"uploading {local.name} ({local.stat().st_size} bytes)…"):
        written = call(lambda: session.upload(remote, local), url)
    _emit(written) if as_json else print(f"/workspace/{written.path}: {written.size} bytes")


@session_app.command("download")
def download(
    session_id: str,
    remote: str,
    local: Path,
    url: Url = DEFAULT_URL,
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Copy /workspace/REMOTE to a local file."""
    session = _session(_client(url, key), session_id)
    with err.status(f"downloading {remote}…"):
        saved = call(lambda: session.download_to(remote, local), url)
    if as_json:
        _emit({"path": str(saved), "size": saved.stat().st_size})
    else:
        err.print(f"saved {saved}", highlight=False)
