"""`sandcell admin workers` and `sandcell admin drain-worker`: on this host's store, audited."""

import json
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from sandcell.domain.workers import StopMode, WorkerStatus
from sandcell.services.workers import WorkerControl
from sandcell.settings import Settings

console = Console()


def _control() -> WorkerControl:
    from sandcell.app import build_services  # lazily: other commands start without it

    services = build_services(Settings())
    return WorkerControl(services.store, services.auth.audit)


def list_workers(
    include_stopped: Annotated[bool, typer.Option(help="also workers that stopped")] = False,
) -> None:
    """List workers: state, when last seen, and the jobs each one holds."""
    now = time.time()
    table = Table("id", "host", "state", "seen", "running jobs")
    for worker in _control().workers(include_stopped):
        table.add_row(worker.id, worker.host, worker.state(now), _ago(worker, now), _jobs(worker))
    console.print(table)


def drain_worker(
    worker_id: str,
    mode: Annotated[
        StopMode, typer.Option(help="drain: finish running jobs, then exit; stop: now")
    ] = StopMode.DRAIN,
) -> None:
    """Ask a worker to drain or stop; it acts when it next reports in (about a second)."""
    worker = _control().request_stop(worker_id, mode, actor="cli")
    console.print_json(json.dumps({"id": worker.id, "state": worker.state(time.time())}))


def _ago(worker: WorkerStatus, now: float) -> str:
    return f"{now - worker.seen_at:.0f} s ago"


def _jobs(worker: WorkerStatus) -> str:
    return ", ".join(worker.running_jobs) or "-"
