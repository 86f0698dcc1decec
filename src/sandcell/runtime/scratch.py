"""The per-sandbox scratch directory on the host and its size-limited disk.

    <root> = <volatile>/sandboxes/<sandbox_id>/    0700, root, on a tmpfs (volatile.py)
        bundle/config.json             the OCI spec runsc boots
        job/main.py                    the code, bound read-only at /job
        disk/workspace, disk/output    on the mounted disk image, bound read-write at
                                       /workspace and /output
        runsc.log                      runsc's own log (never shown to the tenant)
        channel/                       a warm sandbox's guest channel (hand_over.py)
    <spill> = <state_dir>/disks/<sandbox_id>/      what may be large, on the state_dir's disk
        disk.img                       ext4 image of limits.disk_mb (a blank one's copy, ext4.py),
                                       loop-mounted on <root>/disk
        input/...                      the input files, bound read-only at /input

/workspace and /output share one ext4 image so that `disk_mb` is one budget for both and a
full disk is a plain ENOSPC inside the sandbox that cannot touch the host's filesystem.
Without a spill directory, everything is under <root> (a bwrap job without inputs: its disk
is a kept one, and an empty /input costs nothing on the tmpfs). With a shelf (the bwrap
runtime's), the disk is a kept one instead, mounted at <sandboxes>/.disk-<hex>/disk with its
image in <disks>/.disk-<hex>/, and goes back to the shelf at teardown (disk_shelf.py).
"""

import errno
import fcntl
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.paths import safe_relative_path
from sandcell.ports.runtime import InputFile
from sandcell.runtime.cgroups import read_pseudo_file
from sandcell.runtime.ext4 import BlankDisks, ScratchError, attach_loop, make_ext4
from sandcell.runtime.mounts import MNT_DETACH, MS_NOATIME, MS_NODEV, MS_NOSUID, mount, umount
from sandcell.runtime.settle import settled

if TYPE_CHECKING:
    from sandcell.runtime.disk_shelf import DiskShelf, KeptDisk

GUEST_UID = 65534
DISK_DIRS = ("workspace", "output")  # at the disk's root: see `workspace` and `output`
# Host mount options. nosuid/nodev: nothing on a tenant's disk may gain privileges or reach
# a device. No noexec: /workspace is where users build and run scripts, and exec inside the
# sandbox gives nothing the interpreter does not already have; /output gets noexec in the
# OCI mount instead (see bundle.py).
MOUNT_OPTIONS = "nosuid,nodev,noatime"
MOUNT_FLAGS = MS_NOSUID | MS_NODEV | MS_NOATIME  # the same, as mount(2) flags
# A job's disk is thrown away with its sandbox, so nothing on it needs to reach the host's
# disk. With barriers, its unmount's cache flush (and any fsync inside the job) made the loop
# device fsync the image file onto the host's disk, a wait on real I/O in every release.
JOB_DISK_DATA = b"nobarrier"
LOOP_CLR_FD = 0x4C01
LOOP_RELEASE_S = 2.0  # how long a detached loop may stay bound to a filesystem being freed
FULL_SLACK_BYTES = 1024 * 1024  # "full": less than this (or 2%) left, or no inode left


def scratch_blanks(directory: Path) -> BlankDisks:
    """The blank disks that scratch disks are copied from."""
    return BlankDisks(directory, DISK_DIRS, GUEST_UID)


@dataclass
class Scratch:
    root: Path
    blanks: BlankDisks | None = None  # None: the disk is formatted in place
    loop_device: str | None = None
    spill: Path | None = None  # the disk image and inputs; None: under root
    shelf: "DiskShelf | None" = None  # the disk comes from (and goes back to) it: disk_shelf.py
    kept: "KeptDisk | None" = None  # the shelf's disk this scratch has

    @property
    def spill_dir(self) -> Path:
        return self.spill or self.root

    @property
    def directories(self) -> list[Path]:
        """The root, and the spill if it is elsewhere."""
        return [self.root] if self.spill is None else [self.root, self.spill]

    @property
    def bundle(self) -> Path:
        return self.root / "bundle"

    @property
    def job(self) -> Path:
        return self.root / "job"

    @property
    def input(self) -> Path:
        return self.spill_dir / "input"

    @property
    def image(self) -> Path:
        return self.spill_dir / "disk.img"

    @property
    def disk(self) -> Path:
        return self.root / "disk" if self.kept is None else self.kept.mount

    @property
    def workspace(self) -> Path:
        return self.disk / "workspace"

    @property
    def output(self) -> Path:
        return self.disk / "output"

    @property
    def log(self) -> Path:
        return self.root / "runsc.log"

    def claim(self) -> bool:
        """Create the (empty) scratch root and spill; False if either exists: the id belongs to
        another run."""
        try:
            self.root.mkdir(mode=0o700)
        except FileExistsError:
            return False
        if self.spill is None:
            return True
        try:
            self.spill.mkdir(mode=0o700)
        except FileExistsError:
            self.root.rmdir()
            return False
        return True

    def let_through(self) -> None:
        """Let other uids get through (not list) the root-only scratch directories: bwrap runs
        as the sandbox's uid and opens its bind sources by path."""
        for directory in self.directories:
            directory.chmod(0o711)

    def create(self, code: bytes | None, inputs: list[InputFile], disk_mb: int) -> None:
        """Fill a claimed scratch root: bundle dir, /job, /input and the mounted disk."""
        for path in (self.bundle, self.job, self.input):
            path.mkdir(mode=0o755)
        self.fill(code, inputs)
        if self.shelf is None:
            self.make_disk(disk_mb)
        else:
            self.kept = self.shelf.take(disk_mb)

    def fill(self, code: bytes | None, inputs: list[InputFile]) -> None:
        """The code at /job/main.py and the inputs under /input (a warm sandbox: at hand-over;
        runsc's gofer shows files added to a bind mount after the sandbox started)."""
        if code is not None:
            _write_readable(self.job / "main.py", code)
        for item in inputs:
            _copy_input(item, self.input)

    def restore_outputs(self, items: list[InputFile], owner: int) -> None:
        """Put committed stage files back under /output (a retry), owned by the guest's uid.

        They land on the scratch disk, so they count against disk_mb like anything the program
        writes; a stage that no longer fits is an error before the program starts.
        """
        for item in items:
            target = _make_parents(self.output, safe_relative_path(item.guest_path), owner)
            _copy_owned(item.host_path, target, owner)

    def make_disk(self, disk_mb: int) -> None:
        """The disk, mounted at `disk`, with its /workspace and /output made and the guest's
        from the start."""
        self.disk.mkdir(mode=0o755)
        if self.blanks is not None:
            self.blanks.copy(disk_mb, self.image)
        else:
            make_ext4(self.image, disk_mb, top=DISK_DIRS, owner=GUEST_UID)
        self.loop_device = attach_loop(self.image)
        mounted = mount(self.loop_device, self.disk, b"ext4", MOUNT_FLAGS, JOB_DISK_DATA)
        _checked(mounted, f"mount {self.loop_device}")

    def disk_full(self) -> bool:
        """No free blocks or inodes left for the guest: what ENOSPC looks like from outside."""
        if not self.is_mounted():
            return False
        fs = os.statvfs(self.disk)
        # A write larger than what is left fails whole, so up to one big buffer stays free.
        slack = max(FULL_SLACK_BYTES, fs.f_blocks * fs.f_frsize // 50)
        return fs.f_bavail * fs.f_frsize < slack or fs.f_favail == 0

    def used_bytes(self) -> int:
        fs = os.statvfs(self.disk)
        return (fs.f_blocks - fs.f_bfree) * fs.f_frsize

    def is_mounted(self) -> bool:
        return os.path.ismount(self.disk)

    def teardown(self, reusable: bool = False) -> list[str]:
        """Unmount, detach and delete everything; return what could not be removed. A shelf's
        disk goes back to it instead, to be kept if `reusable`: the sandbox is provably gone."""
        if self.kept is not None:
            assert self.shelf is not None
            problems = self.shelf.give_back(self.kept, reusable)  # the kept disk's leftovers
            if not problems:
                self.kept = None
        else:
            problems = self._release_disk()
        for directory in self.directories:
            shutil.rmtree(directory, ignore_errors=True)
        return problems + self.leftovers()

    def _release_disk(self) -> list[str]:
        """Unmount and detach this scratch's own disk."""
        # System calls, not umount(8) and losetup(8): two process starts were most of the
        # release time, and the release is on the job's path.
        problems: list[str] = []
        if self.is_mounted():
            umount(self.disk)
        if self.is_mounted():  # something still holds it open: detach it from the tree
            _note(problems, umount(self.disk, MNT_DETACH), f"umount --lazy {self.disk}")
        if self.loop_device and self._owns_loop():  # loop numbers are reused: only if ours
            _note(problems, _detach_loop(self.loop_device), f"losetup --detach {self.loop_device}")
            # A mount namespace of the sandbox's (the gofer's) may still hold the filesystem:
            # the kernel frees it, and only then detaches the loop, a moment after the exit.
            settled(lambda: not self._owns_loop(), LOOP_RELEASE_S)
        return problems

    def _owns_loop(self) -> bool:
        if self.loop_device is None:
            return False
        backing = loop_backing_file(self.loop_device)  # "<path> (deleted)" once rmtree'd
        return backing is not None and backing.startswith(str(self.image))

    def leftovers(self) -> list[str]:
        """What of this scratch still exists on the host (empty: fully released). A kept
        disk not yet given back is the shelf's to account for (its give_back says)."""
        left = []
        if self.kept is None and self.is_mounted():
            left.append(f"mount {self.disk}")
        if self._owns_loop():
            left.append(f"loop device {self.loop_device}")
        left += [f"directory {d}" for d in self.directories if d.exists()]
        return left


def loop_backing_file(device: str) -> str | None:
    """The file behind loop `device` (e.g. /dev/loop3), or None if it is detached."""
    name = os.path.basename(device)
    try:
        backing = read_pseudo_file(f"/sys/block/{name}/loop/backing_file")
    except OSError:
        return None
    return os.fsdecode(backing).strip()


def attached_loops() -> dict[str, str]:
    """Every attached loop device -> its backing file."""
    loops = {}
    for sys_dir in Path("/sys/block").glob("loop*"):
        backing = loop_backing_file(sys_dir.name)
        if backing is not None:
            loops[f"/dev/{sys_dir.name}"] = backing
    return loops


def _copy_input(item: InputFile, input_root: Path) -> None:
    rel = safe_relative_path(item.guest_path)  # validated upstream; checked again here
    target = input_root / rel
    parent = input_root
    for part in Path(rel).parent.parts:
        parent = parent / part
        parent.mkdir(mode=0o755, exist_ok=True)
    shutil.copyfile(item.host_path, target)
    target.chmod(0o644)


def _make_parents(root: Path, rel: str, owner: int) -> Path:
    """The directories above `root/rel`, made as `owner`'s; return the file's path."""
    parent = root
    for part in Path(rel).parent.parts:
        parent = parent / part
        if not parent.is_dir():
            parent.mkdir(mode=0o755)
            os.chown(parent, owner, owner)
    return root / rel


def _copy_owned(source: Path, target: Path, owner: int) -> None:
    # O_NOFOLLOW: nothing of the guest's is on this disk yet, but never write through a link.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out, source.open("rb") as content:
        shutil.copyfileobj(content, out, 1 << 20)
        os.fchown(out.fileno(), owner, owner)


def _write_readable(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _detach_loop(device: str) -> int:
    """LOOP_CLR_FD, what `losetup --detach` does; 0 or the errno (ENXIO: already detached)."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        return exc.errno or 1
    try:
        fcntl.ioctl(fd, LOOP_CLR_FD)
    except OSError as exc:
        return 0 if exc.errno == errno.ENXIO else exc.errno or 1
    finally:
        os.close(fd)
    return 0


def _checked(err: int, what: str) -> None:
    if err:
        raise ScratchError(f"{what} failed: {os.strerror(err)}")


def _note(problems: list[str], err: int, what: str) -> None:
    if err:
        problems.append(f"{what} failed: {os.strerror(err)}")


def probe_loop_disk(workdir: Path) -> None:
    """Set up and tear down a tiny scratch disk; raise RuntimeUnavailable if that fails."""
    probe = Scratch(workdir / ".probe")
    shutil.rmtree(probe.root, ignore_errors=True)
    try:
        probe.claim()
        probe.create(None, [], disk_mb=4)
    except (OSError, ScratchError) as exc:
        raise RuntimeUnavailable(f"cannot set up a loop-mounted scratch disk: {exc}") from exc
    finally:
        left = probe.teardown()
    if left:
        raise RuntimeUnavailable(f"scratch disk probe left {', '.join(left)}")
