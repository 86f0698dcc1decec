"""File access inside a sandbox's workspace from the trusted side, without following links.

The guest can plant symlinks anywhere in its workspace; every path is walked one component at
a time with O_NOFOLLOW from a directory descriptor, so nothing resolves outside the root.
"""

import os
import stat
from pathlib import Path
from typing import Any

from sandcell.domain.errors import FieldError, InvalidRequest, NotFound, PayloadTooLarge
from sandcell.domain.paths import safe_relative_path

GUEST_UID = 65534
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _checked(path: str) -> list[str]:
    if path in ("", "."):
        return []
    try:
        return safe_relative_path(path).split("/")
    except ValueError as exc:
        raise InvalidRequest(errors=[FieldError("path", str(exc))]) from exc


def _open_dir(root: Path, parts: list[str], create: bool = False) -> int:
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts:
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    os.chown(part, GUEST_UID, GUEST_UID, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except OSError as exc:
        os.close(fd)
        raise NotFound("no such directory in the workspace") from exc
    return fd


def read_file(root: Path, path: str, max_bytes: int) -> bytes:
    *parents, name = _checked(path) or [""]
    dir_fd = _open_dir(root, parents)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        raise NotFound("no such file in the workspace") from exc
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise NotFound("not a regular file")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"the file is larger than {max_bytes} bytes")
    return data


def write_file(root: Path, path: str, content: bytes) -> int:
    *parents, name = _checked(path) or [""]
    if not name:
        raise InvalidRequest(errors=[FieldError("path", "a file name is required")])
    dir_fd = _open_dir(root, parents, create=True)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        message = f"cannot write there: {exc.strerror}"
        raise InvalidRequest(errors=[FieldError("path", message)]) from exc
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "wb") as handle:
        handle.write(content)
        os.fchown(handle.fileno(), GUEST_UID, GUEST_UID)
    return len(content)


def list_dir(root: Path, path: str, limit: int = 1000) -> list[dict[str, Any]]:
    dir_fd = _open_dir(root, _checked(path))
    entries = []
    try:
        for name in sorted(os.listdir(dir_fd))[:limit]:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            kind = "dir" if stat.S_ISDIR(info.st_mode) else "file"
            if stat.S_ISLNK(info.st_mode):
                kind = "symlink"
            elif not stat.S_ISREG(info.st_mode) and kind != "dir":
                kind = "other"
            shown = name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            entries.append({"name": shown, "type": kind, "size": info.st_size})
    finally:
        os.close(dir_fd)
    return entries
