"""Removing what a crashed runtime left on the host: cgroups, mounts, loop devices, scratch.

Shared by the runtimes that keep their sandboxes under `<state_dir>/sandboxes` and their
cgroups under one parent (see cgroups.py and scratch.py).
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

from sandcell.runtime import cgroups
from sandcell.runtime.cgroups import SandboxCgroup
from sandcell.runtime.scratch import attached_loops
from sandcell.runtime.settle import settled


def reap_cgroups(parent: str) -> list[str]:
    """Kill every process in every cgroup under `parent`, then remove them and `parent`."""
    removed = []
    for name in sorted(cgroups.children(parent)):
        cgroup = SandboxCgroup(f"{parent}/{name}")
        cgroup.kill_all()
        cgroup.remove()
        removed.append(f"cgroup {cgroup.relpath}")
    remove_parent(parent)
    return removed


def remove_parent(parent: str) -> None:
    """Remove `parent` if no cgroup is left under it: one per state_dir would otherwise pile up
    on the host (a runtime's next sandbox makes it again)."""
    SandboxCgroup(parent).remove(timeout_s=0)


def reap_scratch(sandboxes_dir: Path, disks_dir: Path) -> list[str]:
    """Unmount, detach and delete every scratch directory under `sandboxes_dir`, and every
    disk image and input directory under `disks_dir` (see scratch.py)."""
    removed = []
    for mount_point in mounts_under(f"{sandboxes_dir}/"):
        subprocess.run(["umount", "--lazy", mount_point], capture_output=True, check=False)
        removed.append(f"mount {mount_point}")
    for device, backing in attached_loops().items():
        if backing.startswith((f"{sandboxes_dir}/", f"{disks_dir}/")):
            subprocess.run(["losetup", "--detach", device], capture_output=True, check=False)
            removed.append(f"loop device {device}")
    for directory, what in ((sandboxes_dir, "scratch"), (disks_dir, "disk")):
        if directory.is_dir():
            for leftover in sorted(directory.iterdir()):
                shutil.rmtree(leftover, ignore_errors=True)
                removed.append(f"{what} {leftover.name}")
    return removed


def mounts_under(prefix: str) -> list[str]:
    """Mount points below `prefix`, deepest first (so they unmount in order)."""
    points = [point for point in mount_points() if point.startswith(prefix)]
    return sorted(points, key=len, reverse=True)


def is_mount_point(path: Path) -> bool:
    """Whether something is mounted at `path`. os.path.ismount cannot tell a bind mount from a
    directory of the same filesystem; mountinfo can."""
    return os.path.realpath(path) in mount_points()


def mount_points(pid: int | str = "self") -> list[str]:
    """Every mount point of the mount namespace process `pid` is in (mountinfo's fifth
    field); by default, this process's."""
    with open(f"/proc/{pid}/mountinfo") as mountinfo:
        return [_unescape(line.split()[4]) for line in mountinfo]


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def processes_mentioning(text: str) -> list[int]:
    """Live host processes whose command line names `text` (a sandbox id)."""
    found = []
    needle = text.encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = cgroups.read_pseudo_file(f"/proc/{entry.name}/cmdline")
        except OSError:
            continue  # gone while we looked
        if needle in cmdline:
            found.append(int(entry.name))
    return found


def waited(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether `proc` exited within `timeout_s` (reaped if it did)."""
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def wait_until_gone(sandbox_id: str, timeout_s: float = 5.0) -> list[str]:
    """Released means no host process left: wait until none names the sandbox; report any
    that stay."""
    left: list[int] = []

    def gone() -> bool:
        left[:] = processes_mentioning(sandbox_id)  # a scan of every host process: ~2 ms
        return not left

    settled(gone, timeout_s)
    return [f"host processes {left}"] if left else []


def left_on_host(sandbox_id: str, cgroup: SandboxCgroup) -> list[str]:
    """What of a job's sandbox is still running on the host, once its release is done.

    Every process of the sandbox was started inside its cgroup, and a task leaves a cgroup
    only on its way out, after its memory (and so its command line) is gone; the cgroup's
    rmdir succeeds only once none is left. So a removed cgroup is already the proof, and the
    scan of every host process (1-2 ms of CPU with 16 sandboxes up) runs only without it."""
    return wait_until_gone(sandbox_id) if cgroup.exists() else []
