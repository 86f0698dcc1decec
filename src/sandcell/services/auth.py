"""Tenants, API keys and who is calling.

A key is `sc_<key id>_<secret>`; only sha256(secret) is stored. The secret has 256 bits, so a
fast hash is enough and lookups stay constant-time by id.
"""

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Any

from sandcell.domain.errors import FieldError, Forbidden, InvalidRequest, NotFound, Unauthorized
from sandcell.domain.ids import new_id
from sandcell.domain.quotas import Quotas
from sandcell.domain.records import ApiKey, Tenant
from sandcell.ports.store import Store
from sandcell.services.audit import AuditLog

TENANT_SCOPES = frozenset({"jobs", "files", "sessions"})
QUOTA_NAMES = frozenset(Quotas().as_dict())


@dataclass(frozen=True)
class Principal:
    key_id: str
    tenant_id: str | None
    scopes: frozenset[str]

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def tenant(self) -> str:
        """The tenant this caller acts for; admin keys own no data."""
        if self.tenant_id is None:
            raise Forbidden("admin keys manage tenants; use a tenant key for this")
        return self.tenant_id

    def require(self, scope: str) -> None:
        if scope not in self.scopes:
            raise Forbidden(f"this API key lacks the '{scope}' scope")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class AuthService:
    def __init__(self, store: Store, admin_key: str = "") -> None:
        self.store = store
        self.audit = AuditLog(store)
        self._admin_key_hash = _hash(admin_key) if admin_key else None

    def create_tenant(
        self,
        name: str,
        limits: dict[str, Any] | None = None,
        images: list[str] | None = None,
        quotas: dict[str, Any] | None = None,
        actor: str | None = None,
    ) -> Tenant:
        tenant = Tenant(new_id("ten"), name, limits or {}, images, time.time(), quotas or {})
        self.store.add_tenant(tenant)
        self.audit.record("tenant.create", actor=actor, tenant_id=tenant.id, name=name)
        return tenant

    def set_quotas(
        self, tenant_id: str, changes: dict[str, Any], actor: str | None = None
    ) -> Tenant:
        """Change a tenant's quota overrides; a None value puts one back to the default.
        Values are checked at the edge (api.schemas.QuotasIn); names are checked here."""
        unknown = sorted(set(changes) - QUOTA_NAMES)
        if unknown:
            errors = [FieldError(f"quotas.{name}", "not a quota") for name in unknown]
            raise InvalidRequest("unknown quotas", errors)
        tenant = self.store.patch_tenant_quotas(tenant_id, changes)
        if tenant is None:
            raise NotFound("no such tenant")
        self.audit.record(
            "tenant.quotas", actor=actor, tenant_id=tenant_id, target=tenant_id, changes=changes
        )
        return tenant

    def create_key(
        self, tenant_id: str | None, scopes: list[str] | None = None, actor: str | None = None
    ) -> str:
        """Make a key and return it in full; it is never shown again."""
        if tenant_id is not None and self.store.get_tenant(tenant_id) is None:
            raise NotFound("no such tenant")
        chosen = sorted(scopes or (["admin"] if tenant_id is None else TENANT_SCOPES))
        unknown = set(chosen) - TENANT_SCOPES - {"admin"}
        if unknown or (tenant_id is not None and "admin" in chosen):
            raise InvalidRequest(f"unknown or misplaced scopes: {sorted(unknown) or ['admin']}")
        key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        self.store.add_api_key(ApiKey(key_id, tenant_id, chosen, time.time()), _hash(secret))
        self.audit.record(
            "key.create", actor=actor, tenant_id=tenant_id, target=key_id, scopes=chosen
        )
        return f"sc_{key_id}_{secret}"

    def revoke_key(self, key_id: str, actor: str | None = None) -> None:
        if not self.store.revoke_api_key(key_id, time.time()):
            raise NotFound("no such active key")
        self.audit.record("key.revoke", actor=actor, target=key_id)

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization or not authorization.startswith("Bearer "):
            raise Unauthorized("send Authorization: Bearer <api key>")
        token = authorization.removeprefix("Bearer ").strip()
        if self._admin_key_hash and hmac.compare_digest(_hash(token), self._admin_key_hash):
            return Principal("env-admin", None, frozenset({"admin"}))
        try:
            return self._stored_key(token)
        except Unauthorized as exc:
            # The key id (public) names who tried; the secret part is never recorded.
            parts = token.split("_", 2)
            key_id = parts[1][:32] if len(parts) == 3 and parts[0] == "sc" else None
            self.audit.record("auth.failure", actor=key_id, outcome="denied", why=exc.detail)
            raise

    def _stored_key(self, token: str) -> Principal:
        parts = token.split("_", 2)
        if len(parts) != 3 or parts[0] != "sc":
            raise Unauthorized("malformed API key")
        found = self.store.get_api_key(parts[1])
        if found is None or not hmac.compare_digest(found[1], _hash(parts[2])):
            raise Unauthorized("invalid API key")
        key = found[0]
        if key.revoked_at is not None:
            raise Unauthorized("this API key was revoked")
        return Principal(key.id, key.tenant_id, frozenset(key.scopes))
