"""`sandcell`: the server, the worker, and a client for people (typer + rich)."""

import json
import logging
import shlex
import shutil
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from sandcell import __version__
from sandcell.cli import tenants, workers
from sandcell.cli.acceptance import acceptance
from sandcell.cli.bench import bench_command
from sandcell.cli.client import AsJson, client_app, run_command
from sandcell.cli.session import session_app
from sandcell.cli.supervise import STOPPED_ON_REQUEST, EmbeddedWorker
from sandcell.remote.session_client import SERVER_KEEP_ALIVE_S
from sandcell.settings import Settings

app = typer.Typer(no_args_is_help=True, help="sandcell: secure code-interpreter jobs in gVisor.")
admin_app = typer.Typer(no_args_is_help=True, help="Tenants and API keys (on this host's store).")
image_app = typer.Typer(no_args_is_help=True, help="Build and list approved images.")
app.add_typer(admin_app, name="admin")
admin_app.command("workers")(workers.list_workers)
admin_app.command("drain-worker")(workers.drain_worker)
admin_app.command("set-quotas")(tenants.set_quotas)
app.add_typer(image_app, name="image")
app.add_typer(client_app, name="jobs")
app.add_typer(session_app, name="session")
app.command("run")(run_command)
app.command("bench")(bench_command)
app.command("acceptance")(acceptance)
console = Console()
err = Console(stderr=True)


def _settings(**overrides: Any) -> Settings:
    values = {k: v for k, v in overrides.items() if v is not None}
    return Settings(**values)


def _setup_logging(settings: Settings) -> None:
    from sandcell import logs

    logs.configure(logging.INFO, settings.admin_key, settings.signing_key)


@app.command()
def version(as_json: AsJson = False) -> None:
    """Print the version."""
    if as_json:
        print(json.dumps({"version": __version__}))
    else:
        console.print(__version__)


@app.command()
def mcp(
    transport: Annotated[
        str,
        typer.Option(
            help="stdio, or http (streamable HTTP at /mcp)", envvar="SANDCELL_MCP_TRANSPORT"
        ),
    ] = "stdio",
    host: Annotated[str, typer.Option(help="http: address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="http: port", envvar="SANDCELL_MCP_PORT")] = 8765,
) -> None:
    """Serve MCP tools for agents (SANDCELL_URL and SANDCELL_API_KEY from the environment)."""
    from sandcell.mcp.server import serve as serve_mcp

    if transport not in ("stdio", "http"):
        raise typer.BadParameter("stdio or http", param_hint="--transport")
    serve_mcp("stdio" if transport == "stdio" else "http", host, port)


@app.command()
def serve(
    port: Annotated[int | None, typer.Option(envvar="SANDCELL_PORT")] = None,
    host: Annotated[str | None, typer.Option(envvar="SANDCELL_HOST")] = None,
    data_dir: Annotated[Path | None, typer.Option(envvar="SANDCELL_DATA_DIR")] = None,
    no_worker: Annotated[bool, typer.Option("--no-worker", help="API only (scale-out)")] = False,
) -> None:
    """Run the API (and, unless --no-worker, one worker) on the embedded defaults."""
    import uvicorn

    from sandcell.app import build_api

    settings = _settings(port=port, host=host, data_dir=data_dir)
    _setup_logging(settings)
    api = build_api(settings)  # creates the schema before the worker starts
    server = uvicorn.Server(
        uvicorn.Config(
            api,
            host=settings.host,
            port=settings.port,
            log_config=None,
            timeout_keep_alive=SERVER_KEEP_ALIVE_S,
        )
    )
    stop_serving = lambda: setattr(server, "should_exit", True)  # noqa: E731
    worker = None if no_worker else EmbeddedWorker(settings.data_dir, stop_serving)
    err.print(f"sandcell {__version__} on http://{settings.host}:{settings.port}")
    err.print(api_key_hint(settings), highlight=False, markup=False, soft_wrap=True)
    # uvicorn re-raises the SIGTERM it handled once it has stopped; with the default handler
    # that would kill this process before it waits for the worker to pause its sessions.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run()
    finally:
        if worker is not None:
            worker.close()
    if worker is not None and worker.failed_with is not None:
        err.print(f"sandcell serve: the worker exited with status {worker.failed_with}")
        raise typer.Exit(1)


def api_key_hint(settings: Settings) -> str:
    """How to get a tenant key, as commands that can be pasted into a shell as printed."""
    command = invocation()
    if settings.data_dir != Settings.model_fields["data_dir"].default:
        command = f"SANDCELL_DATA_DIR={shlex.quote(str(settings.data_dir))} {command}"
    return (
        f"API key: `{command} admin create-tenant NAME` then"
        f" `{command} admin create-key --tenant ID`"
        " (or set SANDCELL_ADMIN_KEY and use POST /v1/admin/tenants)."
    )


def invocation() -> str:
    """This program as a command: after the README's install it is `.venv/bin/sandcell`,
    which is not on PATH, so a bare `sandcell` would not be found."""
    program = Path(sys.argv[0])
    if program.suffix == ".py":  # python -m sandcell.cli.main
        return f"{shlex.quote(sys.executable)} -m sandcell.cli.main"
    found = shutil.which(program.name)
    if found is not None and Path(found).resolve() == program.resolve():
        return program.name
    return shlex.quote(str(program.absolute()))


@app.command()
def worker(
    data_dir: Annotated[Path | None, typer.Option(envvar="SANDCELL_DATA_DIR")] = None,
    slots: Annotated[int | None, typer.Option(envvar="SANDCELL_WORKER_SLOTS")] = None,
) -> None:
    """Run a worker: claim jobs and run them in sandboxes (needs root for runsc)."""
    from sandcell.app import build_internal_app, build_worker

    settings = _settings(data_dir=data_dir, worker_slots=slots)
    _setup_logging(settings)
    listener, url = _internal_listener(settings.worker_listen)
    the_worker = build_worker(settings, url)
    _serve_internal(build_internal_app(settings, the_worker), listener)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if the_worker.serve(stop) is not None:  # an operator drained or stopped it
        raise typer.Exit(STOPPED_ON_REQUEST)


def _internal_listener(listen: str) -> tuple[socket.socket, str]:
    """Bind first, so the worker can announce the real port when 0 was asked for."""
    host, _, port = listen.rpartition(":")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP explicitly: asyncio only sets TCP_NODELAY on sockets whose proto says TCP,
    # and without it every response pays a delayed ACK (~40 ms).
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host.strip("[]"), int(port)))
    except (OSError, ValueError) as exc:
        listener.close()
        why = exc.strerror if isinstance(exc, OSError) else "not HOST:PORT"
        err.print(f"[red]error:[/red] SANDCELL_WORKER_LISTEN={listen}: {why}", soft_wrap=True)
        raise typer.Exit(1) from exc
    listener.listen(128)
    bound = listener.getsockname()[1]
    return listener, f"http://{host}:{bound}"


def _serve_internal(api: Any, listener: socket.socket) -> None:
    import uvicorn

    config = uvicorn.Config(
        api, log_config=None, access_log=False, timeout_keep_alive=SERVER_KEEP_ALIVE_S
    )
    server = uvicorn.Server(config)
    threading.Thread(
        target=server.run, kwargs={"sockets": [listener]}, name="internal-api", daemon=True
    ).start()


def _print_record(record: dict[str, Any], as_json: bool) -> None:
    if as_json:  # exactly one JSON document on stdout, for scripts
        print(json.dumps(record))
    else:
        console.print_json(json.dumps(record))


@admin_app.command("create-tenant")
def create_tenant(
    name: str, images: Annotated[list[str] | None, typer.Option()] = None, as_json: AsJson = False
) -> None:
    """Create a tenant; prints its id."""
    from sandcell.app import build_services

    tenant = build_services(_settings()).auth.create_tenant(name, None, images)
    _print_record({"id": tenant.id, "name": tenant.name}, as_json)


@admin_app.command("create-key")
def create_key(
    tenant: Annotated[str | None, typer.Option(help="tenant id; without it, an admin key")] = None,
    as_json: AsJson = False,
) -> None:
    """Make an API key (shown once). Without --tenant: an admin key."""
    from sandcell.app import build_services

    key = build_services(_settings()).auth.create_key(tenant)
    _print_record({"id": key.split("_")[1], "key": key, "tenant_id": tenant}, as_json)


@admin_app.command("revoke-key")
def revoke_key(key_id: str, as_json: AsJson = False) -> None:
    """Revoke a key; effective at once."""
    from sandcell.app import build_services

    build_services(_settings()).auth.revoke_key(key_id)
    if as_json:
        print(json.dumps({"id": key_id, "revoked": True}))
    else:
        console.print(f"revoked {key_id}")


@image_app.command("build")
def image_build(
    name: Annotated[str, typer.Argument(help="image to build")] = "python",
    force: Annotated[bool, typer.Option(help="rebuild even if built")] = False,
) -> None:
    """Build an image once into the image directory and record its digest."""
    from sandcell.runtime.images import build_image

    settings = _settings()
    with console.status(f"building image {name} (debootstrap, about a minute)…"):
        image = build_image(name, settings.image_dir, force=force)
    console.print(f"{image.name} {image.version} {image.digest}")


@image_app.command("list")
def image_list(as_json: AsJson = False) -> None:
    """List built images."""
    from sandcell.runtime.images import FilesystemImageCatalog

    catalog = FilesystemImageCatalog(_settings().image_dir)
    images = [catalog.get(name) for name in catalog.names()]
    if as_json:
        rows = [{"name": i.name, "version": i.version, "digest": i.digest} for i in images]
        print(json.dumps(rows))
        return
    table = Table("name", "version", "digest")
    for image in images:
        table.add_row(image.name, image.version, image.digest)
    console.print(table)


def main() -> None:
    try:
        app()
    except Exception as exc:  # a clear line for people, never a traceback
        from pydantic import ValidationError

        from sandcell.domain.errors import SandcellError

        if isinstance(exc, SandcellError):
            err.print(f"[red]error:[/red] {exc.detail}")
            raise SystemExit(1) from exc
        if isinstance(exc, ValidationError) and exc.title == Settings.__name__:
            for problem in exc.errors():
                name = "SANDCELL_" + "_".join(str(part) for part in problem["loc"]).upper()
                err.print(f"[red]configuration:[/red] {name}: {problem['msg']}", soft_wrap=True)
            raise SystemExit(2) from exc
        raise


if __name__ == "__main__":
    main()
