"""Admin routes for workers: list them, and drain or stop one through a supported lifecycle.

The request is recorded in the store and read by the worker when it next reports in (about
once a second), so it reaches a worker on any host through any API replica.
"""

import time
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from sandcell.api.deps import Admin, Svc
from sandcell.api.problems import problem_responses
from sandcell.api.schemas import Strict
from sandcell.api.views import iso
from sandcell.domain.workers import StopMode, WorkerState, WorkerStatus
from sandcell.services.workers import WorkerControl

router = APIRouter(prefix="/v1/admin/workers", tags=["admin"])


class WorkerOut(BaseModel):
    id: str
    host: str
    runtime: str
    runtime_version: str
    state: WorkerState
    started_at: str
    seen_at: str
    stopped_at: str | None
    stop_requested_at: str | None
    running_jobs: list[str] = Field(description="ids of the jobs this worker holds now")


class WorkerPage(BaseModel):
    items: list[WorkerOut]


class StopIn(Strict):
    mode: Literal["drain", "stop"] = Field(
        "drain",
        description="drain: claim nothing more, let running jobs finish, then exit. "
        "stop: stop its sandboxes now; their jobs are handed back and, where they allow "
        "another attempt, resume elsewhere from their committed stages.",
    )


def _worker_out(worker: WorkerStatus, now: float) -> WorkerOut:
    return WorkerOut(
        id=worker.id,
        host=worker.host,
        runtime=worker.runtime,
        runtime_version=worker.runtime_version,
        state=worker.state(now),
        started_at=iso(worker.started_at) or "",
        seen_at=iso(worker.seen_at) or "",
        stopped_at=iso(worker.stopped_at),
        stop_requested_at=iso(worker.stop_requested_at),
        running_jobs=worker.running_jobs,
    )


def _control(svc: Svc) -> WorkerControl:
    return WorkerControl(svc.store, svc.auth.audit)


@router.get("", response_model=WorkerPage)
def list_workers(
    svc: Svc,
    _: Admin,
    include_stopped: Annotated[bool, Query(description="also workers that have stopped")] = False,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> WorkerPage:
    """Workers, newest first, with their state and the jobs each one holds."""
    now = time.time()
    workers = _control(svc).workers(include_stopped, limit)
    return WorkerPage(items=[_worker_out(w, now) for w in workers])


@router.get("/{worker_id}", response_model=WorkerOut, responses=problem_responses(404))
def get_worker(svc: Svc, _: Admin, worker_id: str) -> WorkerOut:
    return _worker_out(_control(svc).status(worker_id), time.time())


@router.post(
    "/{worker_id}/drain",
    status_code=202,
    response_model=WorkerOut,
    responses=problem_responses(404, 409),
)
def drain_worker(svc: Svc, who: Admin, worker_id: str, body: StopIn | None = None) -> WorkerOut:
    """Ask a worker to drain (the default) or stop; it acts within about a second (audited)."""
    mode = StopMode(body.mode if body else "drain")
    return _worker_out(_control(svc).request_stop(worker_id, mode, who.key_id), time.time())
