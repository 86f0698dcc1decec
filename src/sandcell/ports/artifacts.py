"""The blob storage port: content addressed by sha256, written atomically."""

from pathlib import Path
from typing import BinaryIO, Protocol


class BlobStore(Protocol):
    def put(self, content: BinaryIO, max_bytes: int | None = None) -> tuple[str, int]:
        """Store the stream; return (sha256 hex, size). Raise PayloadTooLarge past max_bytes."""

    def open(self, sha256: str) -> BinaryIO: ...
    def path(self, sha256: str) -> Path:
        """A local path for the runtime to copy inputs from."""

    def delete(self, sha256: str) -> bool: ...
    def exists(self, sha256: str) -> bool: ...
