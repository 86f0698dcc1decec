"""Admin routes: tenants and keys."""

from fastapi import APIRouter, Response

from sandcell.api.deps import Admin, Svc
from sandcell.api.schemas import KeyIn, KeyOut, TenantIn, TenantOut

router = APIRouter(prefix="/v1/admin", tags=["admin"])


@router.post("/tenants", status_code=201, response_model=TenantOut)
def create_tenant(svc: Svc, _: Admin, body: TenantIn) -> TenantOut:
    tenant = svc.auth.create_tenant(
        body.name, body.limits.model_dump(exclude_none=True), body.images
    )
    return TenantOut(id=tenant.id, name=tenant.name)


@router.post("/tenants/{tenant_id}/keys", status_code=201, response_model=KeyOut)
def create_key(svc: Svc, _: Admin, tenant_id: str, body: KeyIn | None = None) -> KeyOut:
    key = svc.auth.create_key(tenant_id, body.scopes if body else None)
    return KeyOut(id=key.split("_")[1], key=key, tenant_id=tenant_id)


@router.delete("/keys/{key_id}", status_code=204)
def revoke_key(svc: Svc, _: Admin, key_id: str) -> Response:
    svc.auth.revoke_key(key_id)
    return Response(status_code=204)
