"""The blob storage port: content addressed by sha256, written atomically."""

from pathlib import Path
from typing import BinaryIO, Protocol


class BlobStore(Protocol):
    def put(self, content: BinaryIO, max_bytes: int | None = None) -> tuple[str, int]:
        """Store the stream; return (sha256 hex, size). Raise PayloadTooLarge past max_bytes."""

    def open(self, sha256: str) -> BinaryIO: ...
    def path(self, sha256: str) -> Path:
        """A local path for the runtime to copy inputs from."""

    def delete(self, sha256: str, stored_by: float | None = None) -> bool:
        """Remove the blob; with `stored_by`, only if nobody stored it again after that time.

        Content is shared: another job may have just stored the same bytes and not yet
        recorded its artifact, so "no row refers to it" alone is not enough to delete it.
        """

    def exists(self, sha256: str) -> bool: ...
