"""A deterministic digest of a directory tree: what an image's manifest records.

One line per entry, sorted by path, each naming the relative path, type, mode, owner, size and
the sha256 of the content (regular files), of the target (symlinks) or of the device number.
Timestamps are left out so that two builds of the same bytes have the same digest.
"""

import hashlib
import os
import stat
from pathlib import Path

CHUNK = 1024 * 1024
TYPES = {
    stat.S_IFREG: "f",
    stat.S_IFDIR: "d",
    stat.S_IFLNK: "l",
    stat.S_IFCHR: "c",
    stat.S_IFBLK: "b",
    stat.S_IFIFO: "p",
    stat.S_IFSOCK: "s",
}


def tree_digest(root: Path, mount_points: tuple[str, ...] = ()) -> str:
    """ "sha256:<hex>" over every entry below `root` (symlinks are never followed).

    `mount_points` (paths relative to `root`) count as what a build leaves there, an empty
    directory (0755, root's), whatever is mounted on them while sandboxes run.
    """
    total = hashlib.sha256()
    opaque = {os.fsencode(point) for point in mount_points}
    for rel in sorted(_relative_paths(root, opaque)):
        total.update(empty_dir_line(rel) if rel in opaque else _entry_line(root, rel))
    return f"sha256:{total.hexdigest()}"


def _relative_paths(root: Path, opaque: set[bytes]) -> list[bytes]:
    base = os.fsencode(root)
    paths = []
    for dirpath, dirs, files in os.walk(base, followlinks=False):
        for name in dirs + files:
            paths.append(os.path.relpath(os.path.join(dirpath, name), base))
        dirs[:] = [d for d in dirs if os.path.relpath(os.path.join(dirpath, d), base) not in opaque]
    return paths


def empty_dir_line(rel: bytes) -> bytes:
    """The line _entry_line writes for an empty directory, mode 0755, owned by root."""
    return b"\0".join([rel, b"d", b"755", b"0:0", b"0", b""]) + b"\n"


def _entry_line(root: Path, rel: bytes) -> bytes:
    path = os.path.join(os.fsencode(root), rel)
    st = os.lstat(path)
    kind = TYPES.get(stat.S_IFMT(st.st_mode), "?")
    size = st.st_size if kind in ("f", "l") else 0  # directory sizes depend on the filesystem
    fields = [
        rel,
        kind.encode(),
        b"%o" % stat.S_IMODE(st.st_mode),
        b"%d:%d" % (st.st_uid, st.st_gid),
        b"%d" % size,
        _content_hash(path, kind, st).encode(),
    ]
    return b"\0".join(fields) + b"\n"


def _content_hash(path: bytes, kind: str, st: os.stat_result) -> str:
    if kind == "f":
        return _file_sha256(path)
    if kind == "l":
        return hashlib.sha256(os.readlink(path)).hexdigest()
    if kind in ("c", "b"):
        return hashlib.sha256(b"%d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))).hexdigest()
    return ""


def _file_sha256(path: bytes) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
