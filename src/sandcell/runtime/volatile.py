"""Where a runtime keeps what cannot outlive a reboot: runsc's state and the sandboxes' scratch.

    /run/sandcell/                 a tmpfs of its own (mounted unless something is mounted there)
        <key>/runsc/               runsc --root
        <key>/sandboxes/<id>/      a sandbox's scratch, but for its disk image and inputs

<key> is derived from the runtime's state_dir, as its cgroup parent is, so two runtimes on one
host never touch each other's. A job creates and deletes a dozen small files and directories
(bundle, code, mount points, logs, runsc's state and locks). On a disk filesystem that is real
CPU on the job's path, and on an ext4 without a journal much more: every new inode is chosen
past all those deleted in the last minutes (ext4's `recently_deleted`), a scan that grows
with the job rate. On a tmpfs the same files cost almost nothing, and nothing of them is
ever written out. What may be large (the disk image, the inputs) stays on the state_dir's disk
(scratch.py).
"""

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.runtime.mounts import MS_NODEV, MS_NOSUID, mount

RUN_ROOT = Path("/run/sandcell")
HOST_MOUNT_LOCK = RUN_ROOT.parent / f".{RUN_ROOT.name}.lock"
# Small files only (the big ones stay on disk): the bound is a backstop, not a budget.
TMPFS_OPTIONS = b"mode=0711,size=1g"

_mounted: set[Path] = set()  # roots this process has seen mounted


def state_key(state_dir: Path) -> str:
    """A short name for a runtime's state_dir, the same in every process (cgroups use it too)."""
    return hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:12]


def volatile_dir(state_dir: Path, root: Path = RUN_ROOT) -> Path:
    """The volatile directory of the runtime whose state lives in `state_dir`."""
    return root / state_key(state_dir)


def ensure_tmpfs(root: Path = RUN_ROOT) -> None:
    """Mount a tmpfs at `root` unless one is there; callers in other processes wait their turn
    (a lock beside it), so two never stack a mount each. Checked once per process and root:
    runtimes call this before every sandbox."""
    if root in _mounted:
        return
    with host_mount_lock(root.parent / f".{root.name}.lock"):
        if not os.path.ismount(root):
            root.mkdir(mode=0o711, exist_ok=True)
            err = mount("tmpfs", root, b"tmpfs", MS_NOSUID | MS_NODEV, TMPFS_OPTIONS)
            if err:
                raise RuntimeUnavailable(f"cannot mount a tmpfs at {root}: {os.strerror(err)}")
    _mounted.add(root)


@contextmanager
def host_mount_lock(path: Path = HOST_MOUNT_LOCK) -> Iterator[None]:
    """One at a time, for a host mount sandcell makes or removes: two never stack a mount
    each. The lock is a file's flock, taken through an open of its own, so it holds between
    threads of one process as between processes."""
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def remove_if_empty(*paths: Path) -> None:
    """Remove each of `paths` that is an empty directory, in order (children first)."""
    for path in paths:
        with contextlib.suppress(OSError):  # not empty (another run's), or already gone
            path.rmdir()
