"""Input files and output artifacts: upload, read, and signed download URLs."""

import errno
import hashlib
import hmac
import time
from typing import BinaryIO

from sandcell.domain.errors import (
    FieldError,
    InvalidRequest,
    NotFound,
    QuotaExceeded,
    StorageFull,
    Unauthorized,
)
from sandcell.domain.ids import new_id
from sandcell.domain.records import Artifact, StoredFile
from sandcell.ports.artifacts import BlobStore
from sandcell.ports.store import Store
from sandcell.services.auth import Principal

MAX_NAME = 255


def check_file_name(name: str) -> str:
    if not name or len(name) > MAX_NAME:
        raise InvalidRequest(errors=[FieldError("file", f"name must be 1 to {MAX_NAME} chars")])
    if "/" in name or "\\" in name or name in (".", "..") or any(ord(c) < 32 for c in name):
        raise InvalidRequest(
            errors=[FieldError("file", "name must not contain '/', '..', NUL or control chars")]
        )
    return name


class FileService:
    def __init__(
        self, store: Store, blobs: BlobStore, signing_key: bytes, max_file_bytes: int
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.signing_key = signing_key
        self.max_file_bytes = max_file_bytes

    def upload(
        self, who: Principal, name: str, content: BinaryIO, quota_bytes: int | None = None
    ) -> StoredFile:
        who.require("files")
        tenant_id = who.tenant()
        check_file_name(name)
        if quota_bytes is not None and self.store.storage_bytes(tenant_id) >= quota_bytes:
            raise QuotaExceeded("storage quota used up: delete files or retire jobs", 60)
        try:
            sha256, size = self.blobs.put(content, self.max_file_bytes)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StorageFull("the file store is full; try again later") from exc
            raise
        stored = StoredFile(
            new_id("file"), tenant_id, check_file_name(name), size, sha256, time.time()
        )
        self.store.add_file(stored)
        return stored

    def get_file(self, who: Principal, file_id: str) -> StoredFile:
        found = self.store.get_file(who.tenant(), file_id)
        if found is None:
            raise NotFound("no such file")
        return found

    def delete_file(self, who: Principal, file_id: str) -> None:
        who.require("files")
        found = self.get_file(who, file_id)
        self.store.delete_file(who.tenant(), file_id)
        if not self.store.sha256_in_use(found.sha256):
            self.blobs.delete(found.sha256, stored_by=found.created_at)

    # artifacts

    def artifact(self, who: Principal, artifact_id: str) -> Artifact:
        found = self.store.get_artifact(who.tenant(), artifact_id)
        if found is None:
            raise NotFound("no such artifact")
        return found

    def open_artifact(self, artifact: Artifact) -> BinaryIO:
        return self.blobs.open(artifact.sha256)

    def sign(self, artifact: Artifact, ttl_s: float) -> tuple[int, str]:
        expires = int(time.time() + ttl_s)
        return expires, self._signature(artifact.id, artifact.tenant_id, expires)

    def artifact_by_signature(self, artifact_id: str, expires: int, signature: str) -> Artifact:
        # One answer for unknown ids and bad signatures, so a URL reveals nothing it does not sign.
        found = self.store.get_artifact(None, artifact_id)
        expected = self._signature(artifact_id, found.tenant_id if found else "", expires)
        if found is None or not hmac.compare_digest(expected, signature):
            raise Unauthorized("invalid download signature")
        if expires < time.time():
            raise Unauthorized("this download URL has expired")
        return found

    def _signature(self, artifact_id: str, tenant_id: str, expires: int) -> str:
        message = f"{artifact_id}\n{tenant_id}\n{expires}".encode()
        return hmac.new(self.signing_key, message, hashlib.sha256).hexdigest()
