"""Admin routes: tenants, keys and the audit trail."""

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response

from sandcell.api.deps import Admin, Svc
from sandcell.api.schemas import AuditEventOut, AuditPage, KeyIn, KeyOut, TenantIn, TenantOut
from sandcell.api.views import iso

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post("/tenants", status_code=201, response_model=TenantOut)
def create_tenant(svc: Svc, who: Admin, body: TenantIn) -> TenantOut:
    tenant = svc.auth.create_tenant(
        body.name,
        body.limits.model_dump(exclude_none=True),
        body.images,
        body.quotas.model_dump(exclude_none=True),
        actor=who.key_id,
    )
    return TenantOut(id=tenant.id, name=tenant.name)


@router.post("/tenants/{tenant_id}/keys", status_code=201, response_model=KeyOut)
def create_key(svc: Svc, who: Admin, tenant_id: str, body: KeyIn | None = None) -> KeyOut:
    key = svc.auth.create_key(tenant_id, body.scopes if body else None, actor=who.key_id)
    return KeyOut(id=key.split("_")[1], key=key, tenant_id=tenant_id)


@router.delete("/keys/{key_id}", status_code=204)
def revoke_key(svc: Svc, who: Admin, key_id: str) -> Response:
    svc.auth.revoke_key(key_id, actor=who.key_id)
    return Response(status_code=204)


@router.get("/audit", response_model=AuditPage)
def audit(
    svc: Svc,
    _: Admin,
    tenant_id: Annotated[str | None, Query(max_length=64)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    before: Annotated[datetime | None, Query(description="only events before this time")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> AuditPage:
    """The audit trail, newest first: admin actions, refused keys, cancels, retirements."""
    events = svc.auth.audit.events(tenant_id, action, before.timestamp() if before else None, limit)
    return AuditPage(
        items=[
            AuditEventOut(
                id=e.id,
                at=iso(e.at) or "",
                tenant_id=e.tenant_id,
                actor=e.actor,
                action=e.action,
                target=e.target,
                outcome=e.outcome,
                detail=e.detail,
            )
            for e in events
        ]
    )
