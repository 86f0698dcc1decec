"""mount(2) and umount2(2), which Python's os lacks, through the C library.

Each returns 0 or the errno, so every caller words its own failure; mount(8) and umount(8)
would be a process start for each call, and some of these are on a job's path.
"""

import ctypes
import os
from pathlib import Path

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_BIND, MS_REC = 0x20, 0x400, 0x1000, 0x4000
MS_PRIVATE, MS_SHARED = 1 << 18, 1 << 20
MNT_DETACH = 0x2

_libc = ctypes.CDLL(None, use_errno=True)


def mount(
    source: str | Path | None,
    target: Path,
    fstype: bytes | None = None,
    flags: int = 0,
    data: bytes | None = None,
) -> int:
    """mount(2); 0 or the errno."""
    what = None if source is None else os.fsencode(source)
    done = _libc.mount(what, os.fsencode(target), fstype, ctypes.c_ulong(flags), data)
    return 0 if done == 0 else ctypes.get_errno()


def umount(target: Path, flags: int = 0) -> int:
    """umount2(2); 0 or the errno."""
    return 0 if _libc.umount2(os.fsencode(target), flags) == 0 else ctypes.get_errno()
