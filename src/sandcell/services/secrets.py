"""Write-only secret values: stored encrypted, handed only to the egress proxy."""

import re
import time
from typing import Any

from sandcell.domain.errors import FieldError, InvalidRequest, NotFound, SandcellError
from sandcell.domain.records import SecretInfo
from sandcell.ports.egress import SecretBinding
from sandcell.ports.secrets import SecretCipher
from sandcell.ports.store import Store
from sandcell.services.auth import Principal

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
MAX_VALUE = 8192


class SecretService:
    def __init__(self, store: Store, cipher: SecretCipher) -> None:
        self.store = store
        self.cipher = cipher

    def put(self, who: Principal, name: str, value: str) -> SecretInfo:
        who.require("jobs")
        errors = []
        if not NAME.match(name):
            errors.append(FieldError("name", "letters, digits, '_', '.', '-'; at most 128"))
        if not value or len(value) > MAX_VALUE or any(ord(c) < 32 for c in value):
            errors.append(FieldError("value", f"1 to {MAX_VALUE} printable characters"))
        if errors:
            raise InvalidRequest("the secret is invalid", errors)
        ciphertext = self.cipher.encrypt(value.encode())
        return self.store.put_secret(who.tenant(), name, ciphertext, time.time())

    def list_secrets(self, who: Principal) -> list[SecretInfo]:
        return self.store.list_secrets(who.tenant())

    def delete(self, who: Principal, name: str) -> None:
        who.require("jobs")
        if not self.store.delete_secret(who.tenant(), name):
            raise NotFound("no such secret")

    def bindings(self, tenant_id: str, specs: list[dict[str, Any]]) -> list[SecretBinding]:
        """A request's secret rules with their values, for the egress proxy only."""
        names = [str(spec["name"]) for spec in specs]
        values = self.values(tenant_id, names) if names else {}
        return [SecretBinding(spec, values[str(spec["name"])]) for spec in specs]

    def values(self, tenant_id: str, names: list[str]) -> dict[str, str]:
        """Plaintext values, for the worker to hand to the proxy; never logged or stored."""
        found = self.store.secret_ciphertexts(tenant_id, names)
        return {name: self.cipher.decrypt(blob).decode() for name, blob in found.items()}


def secret_bindings(
    service: SecretService | None, tenant_id: str, specs: list[dict[str, Any]]
) -> list[SecretBinding]:
    """Bindings for the proxy; fail closed when secrets are asked for but cannot be read."""
    if not specs:
        return []
    if service is None:
        raise SandcellError("this worker cannot read secrets")
    return service.bindings(tenant_id, specs)
