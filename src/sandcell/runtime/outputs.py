"""Handing the files a program left in /output to the sink, without trusting the tree.

The guest controls every name and type under /output. The walk never follows a symlink
(`os.fwalk` works on directory fds), only regular files are opened, with O_NOFOLLOW relative to
their directory fd, and the opened file must still be the inode that was listed.
"""

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sandcell.domain.paths import safe_relative_path
from sandcell.ports.runtime import SandboxSink

MAX_FILES = 1000
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass
class Collected:
    files: int = 0
    bytes: int = 0
    skipped: int = 0  # symlinks, FIFOs, devices, sockets, odd names, over the file cap


def collect_outputs(output_dir: Path, sink: SandboxSink, max_files: int = MAX_FILES) -> Collected:
    found = Collected()
    for dirpath, dirnames, filenames, dirfd in os.fwalk(output_dir, follow_symlinks=False):
        dirnames.sort()  # a stable order: the same tree reports the same files
        rel_dir = os.path.relpath(dirpath, output_dir)
        for name in sorted(filenames):
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if found.files >= max_files or not _acceptable(rel):
                found.skipped += 1
                continue
            size = _report(dirfd, name, rel, sink)
            if size is None:
                found.skipped += 1
            else:
                found.files += 1
                found.bytes += size
    return found


def _acceptable(rel: str) -> bool:
    try:
        rel.encode("utf-8")  # names that are not UTF-8 arrive as surrogates
        safe_relative_path(rel)
    except ValueError:  # UnicodeEncodeError is a ValueError too
        return False
    return True


def _report(dirfd: int, name: str, rel: str, sink: SandboxSink) -> int | None:
    """Pass one regular file to the sink; None if it is anything else."""
    listed = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    if not stat.S_ISREG(listed.st_mode):
        return None
    try:
        fd = os.open(name, OPEN_FLAGS, dir_fd=dirfd)
    except OSError:  # ELOOP: it became a symlink; anything else: not ours to report
        return None
    with os.fdopen(fd, "rb") as content:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode) or not os.path.samestat(listed, opened):
            return None
        os.set_blocking(fd, True)
        sink.output_file(rel, content, opened.st_size)
        return opened.st_size
