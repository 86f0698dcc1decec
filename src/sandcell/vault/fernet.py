"""Secret values at rest, encrypted with Fernet (AES-128-CBC + HMAC-SHA256, `cryptography`)."""

import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from sandcell.domain.errors import SandcellError


class FernetCipher:
    def __init__(self, key: bytes) -> None:
        self._fernet = Fernet(key)

    @classmethod
    def from_key_file(cls, path: Path) -> "FernetCipher":
        """Use the key in `path`, making it (0600) on first use."""
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass  # another process made it first
            else:
                with os.fdopen(fd, "wb") as out:
                    out.write(Fernet.generate_key())
        return cls(path.read_bytes().strip())

    def encrypt(self, plaintext: bytes) -> bytes:
        return self._fernet.encrypt(plaintext)

    def decrypt(self, ciphertext: bytes) -> bytes:
        try:
            return self._fernet.decrypt(ciphertext)
        except InvalidToken as exc:
            raise SandcellError("a stored secret cannot be decrypted with this key") from exc
