"""Scratch disks kept mounted between bwrap sandboxes, emptied, for the next of their size.

Making a job's disk (a blank's copy, a loop device, a mount) and unmaking it (unmount,
detach, delete) cost 2-7 ms of the machine's CPU a job, by the VM: at 80 jobs/s on two
cores, a tenth of all there is. A disk whose sandbox is provably gone is emptied instead:
its /workspace and /output are removed and made again exactly as on a blank, and it waits,
still mounted, for the next sandbox that asks for its size.

Provably gone: every process of a bwrap sandbox runs in its cgroup, so once that cgroup is
removed nothing can still hold a file of the disk open or write to it (the caller says so).
A gVisor sandbox's gofer is not in its cgroup, so that runtime keeps a fresh disk a job.

A disk is kept only if, once emptied, its free blocks and inodes are those of the fresh disk
(nothing of the last job is left on it, not even an open-but-deleted file) and it is
writable; a disk whose job left many files (emptying would cost more than a new one) or grew
its image on the host is torn down as before. Kept disks sit under the runtime's sandboxes
and disks directories (`.disk-<hex>`, never a sandbox id), so a crashed worker's are reaped
with its sandboxes.
"""

import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.runtime.ext4 import BlankDisks
from sandcell.runtime.scratch import DISK_DIRS, GUEST_UID, Scratch

KEPT_PER_SIZE = 16  # the default worker's slots: one sandbox each at full load
MAX_FILES_TO_EMPTY = 64  # more: removing them one by one costs more than a new disk
MAX_IMAGE_GROWTH_BYTES = 8 << 20  # host blocks the job wrote: a new disk gives them back
IDLE_S = 300.0  # a disk not taken for this long is torn down at the shelf's next use


@dataclass
class KeptDisk:
    scratch: Scratch  # its own: `.disk` is the mount point, `.image` the image
    disk_mb: int
    fresh: tuple[int, int]  # free blocks and inodes when it was new
    image_bytes: int  # the image's host blocks when it was new
    shelved_at: float = 0.0
    retired: bool = False  # torn down (or being): never kept again

    @property
    def mount(self) -> Path:
        return self.scratch.disk


@dataclass
class DiskShelf:
    sandboxes_dir: Path
    disks_dir: Path
    blanks: BlankDisks
    per_size: int = KEPT_PER_SIZE
    _kept: dict[int, list[KeptDisk]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, disk_mb: int) -> KeptDisk:
        """A mounted, empty disk of `disk_mb`: a kept one, or a new one."""
        with self._lock:
            shelf = self._kept.get(disk_mb)
            kept = shelf.pop() if shelf else None  # the last one kept: the warmest
        self._drop_idle()
        if kept is not None and not kept.scratch.is_mounted():  # reaped under the shelf
            self._retire(kept)
            kept = None
        return kept or self._new(disk_mb)

    def give_back(self, disk: KeptDisk, reusable: bool) -> list[str]:
        """Keep `disk` for the next sandbox if `reusable` (its sandbox is gone) and it empties
        clean; otherwise tear it down. What could not be removed, as Scratch.teardown says."""
        if reusable and not disk.retired and _emptied(disk):
            with self._lock:
                shelf = self._kept.setdefault(disk.disk_mb, [])
                if len(shelf) < self.per_size:
                    disk.shelved_at = time.monotonic()
                    shelf.append(disk)
                    return []
        return self._retire(disk)

    def kept(self) -> int:
        with self._lock:
            return sum(map(len, self._kept.values()))

    def close(self) -> list[str]:
        """Tear every kept disk down (the runtime is done)."""
        with self._lock:
            disks = [disk for shelf in self._kept.values() for disk in shelf]
            self._kept.clear()
        return [problem for disk in disks for problem in self._retire(disk)]

    def _new(self, disk_mb: int) -> KeptDisk:
        name = f".disk-{secrets.token_hex(6)}"
        scratch = Scratch(self.sandboxes_dir / name, self.blanks, spill=self.disks_dir / name)
        if not scratch.claim():
            raise FileExistsError(f"disk {name} already exists")
        try:
            scratch.let_through()  # a bwrap sandbox's uid opens /workspace by this path
            scratch.make_disk(disk_mb)
            fs = os.statvfs(scratch.disk)
            image_bytes = os.stat(scratch.image).st_blocks * 512
        except BaseException:
            scratch.teardown()
            raise
        return KeptDisk(scratch, disk_mb, (fs.f_bfree, fs.f_ffree), image_bytes)

    def _drop_idle(self) -> None:
        now, idle = time.monotonic(), []
        with self._lock:
            for size, shelf in self._kept.items():
                idle += [disk for disk in shelf if now - disk.shelved_at > IDLE_S]
                self._kept[size] = [disk for disk in shelf if now - disk.shelved_at <= IDLE_S]
        for disk in idle:
            self._retire(disk)

    @staticmethod
    def _retire(disk: KeptDisk) -> list[str]:
        disk.retired = True
        return disk.scratch.teardown()


def _emptied(disk: KeptDisk) -> bool:
    """Empty `disk` back to its fresh layout; whether it is now as it was new."""
    try:
        if not disk.scratch.is_mounted():
            return False
        fs = os.statvfs(disk.mount)
        files = disk.fresh[1] - fs.f_ffree  # what the job made
        grown = os.stat(disk.scratch.image).st_blocks * 512 - disk.image_bytes
        if fs.f_flag & os.ST_RDONLY or files > MAX_FILES_TO_EMPTY or grown > MAX_IMAGE_GROWTH_BYTES:
            return False
        for name in DISK_DIRS:
            top = disk.mount / name
            shutil.rmtree(top)  # as root, links not followed, whatever modes the job left
            top.mkdir(mode=0o755)
            os.chown(top, GUEST_UID, GUEST_UID)
            top.chmod(0o755)  # not the umask's
        fs = os.statvfs(disk.mount)
        return (fs.f_bfree, fs.f_ffree) == disk.fresh
    except OSError:
        return False
