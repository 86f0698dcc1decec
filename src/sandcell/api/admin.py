"""Admin routes: tenants, keys and the audit trail."""

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Response
from pydantic import BeforeValidator

from sandcell.api.deps import Admin, Svc
from sandcell.api.problems import problem_responses
from sandcell.api.schemas import (
    AuditEventOut,
    AuditPage,
    KeyIn,
    KeyOut,
    TenantIn,
    TenantOut,
    TenantPatch,
    TenantQuotasOut,
)
from sandcell.api.views import iso

router = APIRouter(prefix="/v1/admin", tags=["admin"])


def _not_a_number(value: object) -> object:
    """A date-time, as documented; not the Unix seconds that pydantic would also take."""
    if isinstance(value, str) and value.strip().lstrip("+-").replace(".", "", 1).isdigit():
        raise ValueError("an RFC 3339 date-time, not a number")
    return value


@router.post(
    "/tenants", status_code=201, response_model=TenantOut, responses=problem_responses(409)
)
def create_tenant(svc: Svc, who: Admin, body: TenantIn) -> TenantOut:
    tenant = svc.auth.create_tenant(
        body.name,
        body.limits.model_dump(exclude_none=True),
        body.images,
        body.quotas.model_dump(exclude_none=True),
        actor=who.key_id,
    )
    return TenantOut(id=tenant.id, name=tenant.name)


@router.patch(
    "/tenants/{tenant_id}",
    response_model=TenantQuotasOut,
    responses=problem_responses(404),
)
def update_tenant(svc: Svc, who: Admin, tenant_id: str, body: TenantPatch) -> TenantQuotasOut:
    """Change a tenant's quotas: only the ones named (null puts one back to the default).
    They apply to the next submission or session; nothing running is stopped."""
    changes = body.quotas.model_dump(exclude_unset=True)
    tenant = svc.auth.set_quotas(tenant_id, changes, actor=who.key_id)
    return TenantQuotasOut(
        id=tenant.id,
        name=tenant.name,
        quotas=svc.jobs.policy.quotas_for(tenant).as_dict(),
        quota_overrides=tenant.quotas,
    )


@router.post(
    "/tenants/{tenant_id}/keys",
    status_code=201,
    response_model=KeyOut,
    responses=problem_responses(404),
)
def create_key(svc: Svc, who: Admin, tenant_id: str, body: KeyIn | None = None) -> KeyOut:
    key = svc.auth.create_key(tenant_id, body.scopes if body else None, actor=who.key_id)
    return KeyOut(id=key.split("_")[1], key=key, tenant_id=tenant_id)


@router.delete("/keys/{key_id}", status_code=204, responses=problem_responses(404))
def revoke_key(svc: Svc, who: Admin, key_id: str) -> Response:
    svc.auth.revoke_key(key_id, actor=who.key_id)
    return Response(status_code=204)


@router.get("/audit", response_model=AuditPage)
def audit(
    svc: Svc,
    _: Admin,
    tenant_id: Annotated[str | None, Query(max_length=64)] = None,
    action: Annotated[str | None, Query(max_length=64)] = None,
    before: Annotated[
        datetime | None,
        BeforeValidator(_not_a_number),
        Query(description="only events before this time (RFC 3339)"),
    ] = None,
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
