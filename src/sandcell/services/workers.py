"""Operators drain or stop a worker; the worker learns of it when it next reports in."""

import time

from sandcell.domain.errors import Conflict, NotFound
from sandcell.domain.workers import StopMode, WorkerStatus
from sandcell.ports.store import Store
from sandcell.services.audit import AuditLog


class WorkerControl:
    def __init__(self, store: Store, audit: AuditLog) -> None:
        self.store, self.audit = store, audit

    def workers(self, include_stopped: bool = False, limit: int = 100) -> list[WorkerStatus]:
        return self.store.list_workers(include_stopped, limit)

    def request_stop(self, worker_id: str, mode: StopMode, actor: str | None) -> WorkerStatus:
        """Record the request (audited, refused ones too) and return the worker as it is now."""
        try:
            self.store.request_worker_stop(worker_id, mode, time.time())
        except (NotFound, Conflict) as exc:
            self.audit.record(
                f"worker.{mode}", actor=actor, target=worker_id, outcome="denied", why=exc.detail
            )
            raise
        self.audit.record(f"worker.{mode}", actor=actor, target=worker_id)
        return self.status(worker_id)

    def status(self, worker_id: str) -> WorkerStatus:
        found = self.store.list_workers(True, 1, worker_id)
        if not found:
            raise NotFound(f"no worker {worker_id!r}")
        return found[0]
