"""Content-addressed blobs on a local (or shared) directory, written atomically."""

import hashlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO

from sandcell.domain.errors import PayloadTooLarge

CHUNK = 1 << 20


class FilesystemBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "tmp").mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        if len(sha256) != 64 or not all(c in "0123456789abcdef" for c in sha256):
            raise ValueError("not a sha256 hex digest")
        return self.root / "sha256" / sha256[:2] / sha256

    def put(self, content: BinaryIO, max_bytes: int | None = None) -> tuple[str, int]:
        digest, size = hashlib.sha256(), 0
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := content.read(CHUNK):
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise PayloadTooLarge(f"larger than {max_bytes} bytes")
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            final = self.path(digest.hexdigest())
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return digest.hexdigest(), size

    def open(self, sha256: str) -> BinaryIO:
        return self.path(sha256).open("rb")

    def delete(self, sha256: str, stored_by: float | None = None) -> bool:
        path = self.path(sha256)
        try:
            # Every put replaces the file, so its mtime is the last time anyone stored it.
            if stored_by is not None and path.stat().st_mtime > stored_by:
                return False
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()
