"""Write-only secret values: stored encrypted, handed only to the egress proxy."""

import re
import time

from sandcell.domain.errors import FieldError, InvalidRequest, NotFound
from sandcell.domain.records import SecretInfo
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

    def values(self, tenant_id: str, names: list[str]) -> dict[str, str]:
        """Plaintext values, for the worker to hand to the proxy; never logged or stored."""
        found = self.store.secret_ciphertexts(tenant_id, names)
        return {name: self.cipher.decrypt(blob).decode() for name, blob in found.items()}
