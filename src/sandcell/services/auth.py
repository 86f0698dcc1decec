"""Tenants, API keys and who is calling.

A key is `sc_<key id>_<secret>`; only sha256(secret) is stored. The secret has 256 bits, so a
fast hash is enough and lookups stay constant-time by id.

A request's key check needs no read of the store once its key was checked lately
(`CheckedKeys`): a revocation evicts the key in every process at once by a notification, and
should that be lost, within a second, from the keys revoked lately (`RevokedKeys`).
"""

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from sandcell.domain.errors import FieldError, Forbidden, InvalidRequest, NotFound, Unauthorized
from sandcell.domain.ids import new_id
from sandcell.domain.quotas import Quotas
from sandcell.domain.records import ApiKey, Tenant
from sandcell.ports.notify import ANY, KEY_REVOKED, TENANT_CHANGED, LocalNotifier, Notifier
from sandcell.ports.store import Store
from sandcell.services.audit import AuditLog

TENANT_SCOPES = frozenset({"jobs", "files", "sessions"})
QUOTA_NAMES = frozenset(Quotas().as_dict())
REVOKED_REFRESH_S = 1.0  # how stale a process's view of the revoked keys may be
KEY_TRUST_S = 300.0  # how long a checked key is trusted without a read of its own
REVOKED_WINDOW_S = 1800.0  # how far back revocations are read: past KEY_TRUST_S, and clock skew
CHECKED_KEYS_MAX = 10_000


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


ADMIN_PRINCIPAL = Principal("env-admin", None, frozenset({"admin"}))


def _bearer(authorization: str | None) -> str | None:
    if not authorization or not authorization.startswith("Bearer "):
        return None
    return authorization.removeprefix("Bearer ").strip()


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class RevokedKeys:
    """The API keys revoked within `window_s`, as the store had them at most
    `REVOKED_REFRESH_S` ago. A store that cannot answer refuses the request (503)."""

    def __init__(self, store: Store, window_s: float) -> None:
        self.store, self.window_s = store, window_s
        self._ids: frozenset[str] = frozenset()
        self._read_at = -REVOKED_REFRESH_S
        self._lock = threading.Lock()

    def __contains__(self, key_id: object) -> bool:
        """Whether `key_id` was revoked; reads the store if the view is stale."""
        return key_id in self.fresh_ids()

    def fresh_ids(self) -> frozenset[str]:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= REVOKED_REFRESH_S:
                self._ids = frozenset(self.store.revoked_key_ids(time.time() - self.window_s))
                self._read_at = now
            return self._ids

    def known_revoked(self, key_id: str) -> bool | None:
        """Whether `key_id` was revoked, if the view is fresh; None if that takes a read."""
        if time.monotonic() - self._read_at >= REVOKED_REFRESH_S:
            return None
        return key_id in self._ids


class CheckedKeys:
    """The keys this process checked lately (by the hash of the whole key), trusted for
    KEY_TRUST_S without another read, unless revoked since."""

    def __init__(self, store: Store, notifier: Notifier) -> None:
        self.revoked = RevokedKeys(store, REVOKED_WINDOW_S)
        self._keys: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()
        notifier.listen(KEY_REVOKED, self.forget)

    def at_hand(self, token: str, refresh: bool = False) -> Principal | None:
        """The principal of `token` if checked lately and not revoked since; None if unknown.
        Without `refresh` it never reads the store (None where it would have to)."""
        with self._lock:
            found = self._keys.get(_hash(token))
        if found is None or time.monotonic() - found[1] > KEY_TRUST_S:
            return None
        key_id = found[0].key_id
        revoked = key_id in self.revoked if refresh else self.revoked.known_revoked(key_id)
        return None if revoked in (None, True) else found[0]

    def add(self, token: str, who: Principal) -> None:
        """Trust `token` (just read and checked) from now on, with a fresh view of revocations."""
        self.revoked.fresh_ids()
        with self._lock:
            if len(self._keys) >= CHECKED_KEYS_MAX:
                self._keys.clear()
            self._keys[_hash(token)] = (who, time.monotonic())

    def forget(self, key_id: str) -> None:
        """Drop a revoked key (ANY: every key); any thread."""
        with self._lock:
            for digest, (who, _) in list(self._keys.items()):
                if key_id in (who.key_id, ANY):
                    del self._keys[digest]


class AuthService:
    def __init__(self, store: Store, admin_key: str = "", notifier: Notifier | None = None) -> None:
        self.store = store
        self.audit = AuditLog(store)
        self.notifier: Notifier = notifier or LocalNotifier()
        self.checked = CheckedKeys(store, self.notifier)
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
        self.notifier.notify(TENANT_CHANGED, tenant_id)  # the next submission is held to them
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
        self.checked.forget(key_id)  # this process's at once, before the answer
        self.notifier.notify(KEY_REVOKED, key_id)  # every other process's
        self.audit.record("key.revoke", actor=actor, target=key_id)

    def at_hand(self, authorization: str | None) -> Principal | None:
        """The caller, if knowing it takes no read: the admin key, or a key checked lately.
        None: ask `authenticate` (which may read, so not from the event loop)."""
        token = _bearer(authorization)
        if token is None:
            return None
        if self._is_admin_key(token):
            return ADMIN_PRINCIPAL
        return self.checked.at_hand(token)

    def authenticate(self, authorization: str | None) -> Principal:
        token = _bearer(authorization)
        if token is None:
            raise Unauthorized("send Authorization: Bearer <api key>")
        if self._is_admin_key(token):
            return ADMIN_PRINCIPAL
        known = self.checked.at_hand(token, refresh=True)
        if known is not None:
            return known
        try:
            who = self._stored_key(token)
        except Unauthorized as exc:
            # The key id (public) names who tried; the secret part is never recorded.
            parts = token.split("_", 2)
            key_id = parts[1][:32] if len(parts) == 3 and parts[0] == "sc" else None
            self.audit.record("auth.failure", actor=key_id, outcome="denied", why=exc.detail)
            raise
        self.checked.add(token, who)
        return who

    def _is_admin_key(self, token: str) -> bool:
        expected = self._admin_key_hash
        return expected is not None and hmac.compare_digest(_hash(token), expected)

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
