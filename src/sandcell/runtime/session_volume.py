"""A session's scratch: like a job's (see scratch.py), but its disk outlives the sandbox.

    <session state_dir>/workspace.img    ext4 image of disk_mb: /workspace and /output
    <session state_dir>/checkpoint/      runsc's memory checkpoint, while paused (session.py)
    <runtime state>/sessions/<id>/       the per-sandbox rest: bundle, mount point, logs

The image lives in the session's own state_dir, so the files survive pause, stop, resume and a
restart of the server; only the mount and the per-sandbox directory go with the sandbox.
"""

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sandcell.runtime.ext4 import ScratchError, make_ext4, run_tool
from sandcell.runtime.scratch import GUEST_UID, MOUNT_OPTIONS, Scratch, attached_loops
from sandcell.runtime.settle import settled

VOLUME_NAME = "workspace.img"
# Unlike a job's throwaway disk, this one may see a crash mid-write and is used again: it keeps
# ext4's journal, and it is checked (`e2fsck -p`, which only makes safe repairs) before mounts.
MKFS_OPTIONS = ("-q", "-F", "-m", "0", "-E", "nodiscard")
COMMAND_TIMEOUT_S = 60
# The volume's loop device clears itself once the last mount of it goes, including the copies
# in the sandbox's own mount namespaces, which the kernel tears down a little after runsc's
# processes exit (on a busy host, up to a second or two after our umount).
LOOP_CLEAR_WAIT_S = 5.0


@dataclass
class SessionScratch(Scratch):
    volume: Path = field(default_factory=Path)  # <state_dir>/workspace.img

    @property
    def image(self) -> Path:
        return self.volume

    @property
    def stderr(self) -> Path:
        return self.root / "runsc.stderr"  # runsc's and the kernel's own (pre-capture) stderr

    def create_session(self, disk_mb: int) -> None:
        """Fill a claimed scratch root and mount the session's volume (made on first use)."""
        for path in (self.bundle, self.job, self.input, self.disk):
            path.mkdir(mode=0o755)
        if self.volume.exists():
            _check(self.volume)
        else:
            _format(self.volume, disk_mb)
        # `-o loop` sets the loop device to auto-clear: it goes away with the last unmount,
        # also when a crash left only a lazy unmount to do (see GVisorRuntime.reap).
        options = f"loop,{MOUNT_OPTIONS}"
        mount = ("mount", "-t", "ext4", "-o", options, str(self.volume), str(self.disk))
        run_tool(*mount, timeout_s=COMMAND_TIMEOUT_S)
        self.loop_device = _loop_of(self.volume)
        for path in (self.workspace, self.output):
            path.mkdir(mode=0o755, exist_ok=True)
            os.chown(path, GUEST_UID, GUEST_UID)

    def leftovers(self) -> list[str]:
        settled(lambda: self.is_mounted() or not self._owns_loop(), LOOP_CLEAR_WAIT_S)
        return super().leftovers()


def _format(volume: Path, disk_mb: int) -> None:
    volume.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    make_ext4(volume, disk_mb, MKFS_OPTIONS, COMMAND_TIMEOUT_S)  # whole, or not there at all


def _check(volume: Path) -> None:
    # Exit codes 0-1 mean clean or fixed; anything else needs a human (and fails the start).
    cmd = ["e2fsck", "-p", str(volume)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ScratchError(f"e2fsck failed: {exc}") from exc
    if done.returncode > 1:
        raise ScratchError(f"workspace volume needs repair: {done.stdout[-300:]}")


def _loop_of(volume: Path) -> str | None:
    return next((dev for dev, f in attached_loops().items() if f == str(volume)), None)
