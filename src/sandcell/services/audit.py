"""The audit trail: admin actions, refused credentials, cancellations and retirements."""

import time
from typing import Any

from sandcell.domain.ids import new_id
from sandcell.domain.records import AuditEvent
from sandcell.ports.store import Store


class AuditLog:
    def __init__(self, store: Store) -> None:
        self.store = store

    def record(
        self,
        action: str,
        *,
        actor: str | None,
        tenant_id: str | None = None,
        target: str | None = None,
        outcome: str = "ok",
        **detail: Any,
    ) -> None:
        event = AuditEvent(
            new_id("aud"), time.time(), tenant_id, actor, action, target, outcome, detail
        )
        self.store.audit(event)

    def events(
        self, tenant_id: str | None, action: str | None, before: float | None, limit: int
    ) -> list[AuditEvent]:
        return self.store.audit_events(tenant_id, action, before, limit)
