"""The ext4 images behind scratch disks and session volumes, and the loop devices they mount on.

A job's scratch disk is a blank ext4 image of its `disk_mb`. mkfs.ext4 is a process start and
some 5 ms of CPU, and then losetup is another: on two cores that is a real share of a job's
cost. A blank image of one size is the same every time, and nearly all of it is holes; so each
size is formatted once (BlankDisks) and copied sparse for every sandbox: some 400 KB moved
inside the kernel (copy_file_range), well under a millisecond. The loop device is bound with
the same ioctls losetup uses. The images share a filesystem UUID, which ext4 does not mind and
the guest never sees.
"""

import errno
import fcntl
import os
import secrets
import struct
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

INODES_PER_MB = 64  # bounded inodes: an inode flood ends as ENOSPC, like a byte flood
MIN_INODES = 256
# -m 0: the tenant gets every block (its files are not root's). No journal: a scratch disk is
# thrown away after one run; crash consistency buys nothing and the journal costs space.
MKFS_OPTIONS = ("-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "nodiscard")
COMMAND_TIMEOUT_S = 30
MiB = 1024 * 1024
LOOP_CONTROL = "/dev/loop-control"
LOOP_CTL_GET_FREE, LOOP_CONFIGURE = 0x4C82, 0x4C0A
# struct loop_config: the backing fd, a block size (0: the default), struct loop_info64, and
# reserved words; all zero but the fd.
LOOP_CONFIG = struct.Struct("=II232x64x")
LOOP_ATTEMPTS = 16  # a free device may be taken by another process before we bind it


class ScratchError(Exception):
    """The scratch directory or its disk could not be set up."""


def inodes_for(disk_mb: int) -> int:
    return max(MIN_INODES, disk_mb * INODES_PER_MB)


def make_ext4(
    image: Path,
    disk_mb: int,
    options: tuple[str, ...] = MKFS_OPTIONS,
    timeout_s: float = COMMAND_TIMEOUT_S,
    top: tuple[str, ...] = (),
    owner: int = 0,
) -> None:
    """Format a new image at `image`, under a temporary name until it is whole: a crash never
    leaves a half-made one where a finished one is expected. The directories `top` are made
    at its root, owned by `owner`."""
    partial = image.with_name(f".{image.name}.{secrets.token_hex(4)}.partial")
    try:
        with open(partial, "wb") as img:
            img.truncate(disk_mb * MiB)
        inodes = str(inodes_for(disk_mb))
        with _tree(top, owner) as tree:
            run_tool("mkfs.ext4", *options, "-N", inodes, *tree, str(partial), timeout_s=timeout_s)
        partial.chmod(0o600)
        os.replace(partial, image)
    finally:
        partial.unlink(missing_ok=True)


@contextmanager
def _tree(top: tuple[str, ...], owner: int) -> Iterator[tuple[str, ...]]:
    """mkfs.ext4's arguments for a root holding the directories `top`: none for an empty one."""
    if not top:
        yield ()
        return
    with tempfile.TemporaryDirectory() as tree:
        os.chmod(tree, 0o755)  # the root's mode, as mkfs makes it without a tree
        for name in top:
            os.mkdir(os.path.join(tree, name), 0o755)
            os.chown(os.path.join(tree, name), owner, owner)
        yield ("-d", tree)


class BlankDisks:
    """One blank image per disk size under `directory`, made on first use, copied after; its
    directories `top` already made and owned by `owner` (on every copy, that is a mkdir and a
    chown fewer on the mounted disk, some 0.7 ms of machine CPU a job with the unmount's
    writes)."""

    def __init__(self, directory: Path, top: tuple[str, ...], owner: int) -> None:
        self.directory, self.top, self.owner = directory, top, owner
        self._known: set[Path] = set()  # made or checked by this process

    def copy(self, disk_mb: int, target: Path) -> None:
        copy_sparse(self._blank(disk_mb), target)

    def _blank(self, disk_mb: int) -> Path:
        layout = "-".join((*self.top, str(self.owner)))
        blank = self.directory / f"ext4-{disk_mb}m-{inodes_for(disk_mb)}i-{layout}.img"
        if blank in self._known:
            return blank
        try:
            whole = blank.stat().st_size == disk_mb * MiB
        except FileNotFoundError:
            whole = False
        if not whole:  # two threads may both make it: each renames a whole one into place
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            make_ext4(blank, disk_mb, top=self.top, owner=self.owner)
        self._known.add(blank)
        return blank


def copy_sparse(source: Path, target: Path) -> None:
    """Copy `source` to a new file `target`, its holes left holes (written data only)."""
    with open(source, "rb") as src, open(target, "xb") as dst:
        size = os.fstat(src.fileno()).st_size
        dst.truncate(size)
        offset = 0
        while offset < size:
            try:
                offset = os.lseek(src.fileno(), offset, os.SEEK_DATA)
            except OSError as exc:  # ENXIO: nothing but a hole from here on
                if exc.errno == errno.ENXIO:
                    return
                raise
            end = os.lseek(src.fileno(), offset, os.SEEK_HOLE)
            while offset < end:
                copied = os.copy_file_range(
                    src.fileno(), dst.fileno(), end - offset, offset, offset
                )
                if copied == 0:
                    raise ScratchError(f"{source} shrank while it was copied")
                offset += copied


def attach_loop(image: Path) -> str:
    """Bind a free loop device to `image` (what `losetup --find --show` does); its path."""
    control = os.open(LOOP_CONTROL, os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(LOOP_ATTEMPTS):
            device = f"/dev/loop{fcntl.ioctl(control, LOOP_CTL_GET_FREE)}"
            loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.ioctl(loop, LOOP_CONFIGURE, LOOP_CONFIG.pack(backing, 0))
                return device
            except OSError as exc:
                if exc.errno != errno.EBUSY:  # EBUSY: another process bound it first
                    raise
            finally:
                os.close(loop)
        raise ScratchError(f"no free loop device after {LOOP_ATTEMPTS} attempts")
    finally:
        os.close(backing)
        os.close(control)


def run_tool(*cmd: str, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Run a host tool (mkfs, mount, …); its stdout, or ScratchError saying why not."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ScratchError(f"{cmd[0]} failed: {exc}") from exc
    if done.returncode != 0:
        raise ScratchError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-500:]}")
    return done.stdout
