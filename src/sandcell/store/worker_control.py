"""Queries behind worker drain/stop: the request is a row the worker reads when it reports in.

Going through the store (not a signal or an in-process flag) makes the request reach a worker
on another host, through any API replica, on SQLite and PostgreSQL alike.
"""

from typing import Any

from sqlalchemy import Connection, select, update

from sandcell.domain.errors import Conflict, NotFound
from sandcell.domain.states import JobState
from sandcell.domain.workers import StopMode, WorkerStatus
from sandcell.store.schema import jobs, workers

# A drain may become a stop; a stop is never softened into a drain.
_ESCALATIONS = {None: (StopMode.DRAIN, StopMode.STOP), StopMode.DRAIN: (StopMode.STOP,)}


def request_stop(conn: Connection, worker_id: str, mode: StopMode, at: float) -> None:
    row = conn.execute(select(workers).where(workers.c.id == worker_id).with_for_update()).first()
    if row is None:
        raise NotFound(f"no worker {worker_id!r}")
    if row.stopped_at is not None:
        raise Conflict("the worker has already stopped")
    current = StopMode(row.stop_mode) if row.stop_mode else None
    if mode is current:
        return  # asked twice: the first request stands
    if mode not in _ESCALATIONS.get(current, ()):
        raise Conflict(f"the worker is already asked to {current}")
    conn.execute(
        update(workers)
        .where(workers.c.id == worker_id)
        .values(stop_mode=mode.value, stop_requested_at=at)
    )


def stop_request(conn: Connection, worker_id: str) -> StopMode | None:
    mode = conn.execute(select(workers.c.stop_mode).where(workers.c.id == worker_id)).scalar()
    return StopMode(mode) if mode else None


def list_workers(
    conn: Connection, include_stopped: bool, limit: int, worker_id: str | None = None
) -> list[WorkerStatus]:
    query = select(workers)
    if worker_id is not None:
        query = query.where(workers.c.id == worker_id)
    if not include_stopped:
        query = query.where(workers.c.stopped_at.is_(None))
    query = query.order_by(workers.c.started_at.desc(), workers.c.id).limit(limit)
    rows = conn.execute(query).all()
    running = _running_jobs(conn, [row.id for row in rows])
    return [_status(row, running.get(row.id, [])) for row in rows]


def _running_jobs(conn: Connection, worker_ids: list[str]) -> dict[str, list[str]]:
    query = (
        select(jobs.c.worker_id, jobs.c.id)
        .where(jobs.c.state == JobState.RUNNING.value, jobs.c.worker_id.in_(worker_ids))
        .order_by(jobs.c.claimed_at)
    )
    found: dict[str, list[str]] = {}
    for worker_id, job_id in conn.execute(query):
        found.setdefault(worker_id, []).append(job_id)
    return found


def _status(row: Any, running_jobs: list[str]) -> WorkerStatus:
    return WorkerStatus(
        id=row.id,
        host=row.host,
        runtime=row.runtime,
        runtime_version=row.runtime_version,
        started_at=row.started_at,
        seen_at=row.seen_at,
        stopped_at=row.stopped_at,
        stop_mode=StopMode(row.stop_mode) if row.stop_mode else None,
        stop_requested_at=row.stop_requested_at,
        running_jobs=running_jobs,
    )
