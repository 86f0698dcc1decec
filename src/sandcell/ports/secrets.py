"""Ports for secrets and network policy: encryption at rest, and policy validation."""

from typing import Any, Protocol

from sandcell.domain.errors import FieldError


class SecretCipher(Protocol):
    def encrypt(self, plaintext: bytes) -> bytes: ...
    def decrypt(self, ciphertext: bytes) -> bytes: ...


class NetworkValidator(Protocol):
    def check(self, allow: list[str], secrets: list[dict[str, Any]]) -> list[FieldError]:
        """Field errors for an allow list and secret bindings that could never be applied."""
