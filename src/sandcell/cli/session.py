"""`sandcell session …`: a stateful interpreter from the command line, over the SDK."""

import base64
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from sandcell.cli.client import AsJson, Key, Url, _client, _emit, call, err, safe
from sandcell_client import Client
from sandcell_client._client import Session

session_app = typer.Typer(no_args_is_help=True, help="Stateful interpreter sessions.")


def _session(client: Client, session_id: str) -> Session:
    return Session(client, {"id": session_id})


@session_app.command("start")
def start(
    image: Annotated[str | None, typer.Option()] = None,
    allow: Annotated[list[str] | None, typer.Option("--allow")] = None,
    url: Url = "http://127.0.0.1:8080",
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Start a session; prints its id."""
    body: dict[str, Any] = {"image": image} if image else {}
    if allow:
        body["network"] = {"allow": allow}
    session = call(lambda: _client(url, key).session(**body))
    _emit(session.data, True) if as_json else print(session.id)


@session_app.command("exec")
def execute(
    session_id: str,
    code: Annotated[str | None, typer.Argument(help="code; '-' or omitted reads stdin")] = None,
    file: Annotated[Path | None, typer.Option("--file", "-f", exists=True)] = None,
    timeout: float = 60,
    images: Annotated[Path, typer.Option(help="where image/png outputs are saved")] = Path("."),
    url: Url = "http://127.0.0.1:8080",
    key: Key = "",
    as_json: AsJson = False,
) -> None:
    """Run one cell and show its output; PNG displays are saved as files."""
    source = file.read_text() if file else (sys.stdin.read() if code in (None, "-") else code)
    session = _session(_client(url, key), session_id)
    result = call(lambda: session.execute(source or "", timeout))
    if as_json:
        _emit(result, True)
        return
    _show(result, images)
    if result.get("error"):
        raise typer.Exit(1)


def _show(result: dict[str, Any], images: Path) -> None:
    sys.stdout.write(safe(result.get("stdout", "")))
    sys.stderr.write(safe(result.get("stderr", "")))
    pngs = 0
    for item in result.get("display", []):
        if item.get("mime") == "image/png":
            path = images / f"image-{pngs}.png"
            pngs += 1
            path.write_bytes(base64.b64decode(item["data"]))
            err.print(f"[image/png saved to {path}]")
        elif item.get("mime") == "text/plain":
            print(safe(item.get("data", "")))
    if result.get("result") is not None:
        print(safe(result["result"]))
    if result.get("error"):
        error = result["error"]
        err.print(
            safe("\n".join(error.get("traceback", [])) or f"{error['ename']}: {error['evalue']}")
        )


@session_app.command("pause")
def pause(session_id: str, url: Url = "http://127.0.0.1:8080", key: Key = "") -> None:
    """Pause: keep the workspace and, with gVisor, process memory."""
    _emit(call(lambda: _session(_client(url, key), session_id).pause()), True)


@session_app.command("resume")
def resume(session_id: str, url: Url = "http://127.0.0.1:8080", key: Key = "") -> None:
    """Resume a paused session."""
    _emit(call(lambda: _session(_client(url, key), session_id).resume()), True)


@session_app.command("stop")
def stop(session_id: str, url: Url = "http://127.0.0.1:8080", key: Key = "") -> None:
    """Stop a session and release its sandbox."""
    _emit(call(lambda: _session(_client(url, key), session_id).stop()), True)


@session_app.command("upload")
def upload(
    session_id: str,
    local: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
    remote: str,
    url: Url = "http://127.0.0.1:8080",
    key: Key = "",
) -> None:
    """Copy a local file to /workspace/REMOTE."""
    _emit(
        call(lambda: _session(_client(url, key), session_id).upload(remote, local.read_bytes())),
        True,
    )


@session_app.command("download")
def download(
    session_id: str, remote: str, local: Path, url: Url = "http://127.0.0.1:8080", key: Key = ""
) -> None:
    """Copy /workspace/REMOTE to a local file."""
    local.write_bytes(call(lambda: _session(_client(url, key), session_id).download(remote)))
    err.print(f"saved {local}")
