"""The mount namespace bwrap launches start from (runtime/launch_mounts.py): the host's without
/sys, and every scratch disk mounted on the host after it was made, as the disk is mounted."""

import os
import subprocess
from pathlib import Path

import pytest

from sandcell.runtime.bwrap import BwrapRuntime
from sandcell.runtime.launch import FAILED_EXIT, launch_helper
from sandcell.runtime.launch_mounts import LaunchMounts
from sandcell.runtime.mounts import MNT_DETACH, mount, umount

pytestmark = pytest.mark.bwrap


def mount_points_seen(fd: int) -> list[str]:
    """The mount points a program sees once the launch helper entered the namespace at `fd`."""
    done = subprocess.run(
        [launch_helper(), "mounts", str(fd), "--", "cat", "/proc/self/mountinfo"],
        capture_output=True,
        text=True,
        timeout=30,
        pass_fds=(fd,),
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return [line.split()[4] for line in done.stdout.splitlines()]


def test_launches_see_no_sys_and_each_disk_as_it_is_mounted(bwrap: BwrapRuntime) -> None:
    fd = bwrap.launch_mounts.fd()
    assert fd is not None
    seen = mount_points_seen(fd)
    assert "/" in seen and not [p for p in seen if p == "/sys" or p.startswith("/sys/")]
    host = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    assert "/sys/fs/cgroup/pids" in host  # what the launch joined before it entered
    disk = bwrap.sandboxes_dir / "late-disk"  # as a scratch disk made after the namespace
    disk.mkdir(parents=True)
    try:
        assert mount("tmpfs", disk, b"tmpfs", data=b"size=64k") == 0
        assert str(disk) in mount_points_seen(fd)
        assert umount(disk, MNT_DETACH) == 0
        assert str(disk) not in mount_points_seen(fd)
    finally:
        umount(disk, MNT_DETACH)  # if an assertion left it mounted
        disk.rmdir()


def test_a_namespace_the_disks_would_not_reach_is_not_used(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: it makes a mount namespace")
    elsewhere = tmp_path / "disks"  # on a private mount, not under the shared tmpfs
    elsewhere.mkdir()
    mounts = LaunchMounts(elsewhere)
    assert mounts.fd() is None  # the probe mount did not reach it: launches stay as they were
    assert list(elsewhere.iterdir()) == []  # the probe is gone
    mounts.close()


def test_the_helper_refuses_what_is_not_a_mount_namespace(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: as the worker")
    marker = tmp_path / "ran"
    with open(os.devnull) as not_a_namespace:
        fd = not_a_namespace.fileno()
        done = subprocess.run(
            [launch_helper(), "mounts", str(fd), "--", "touch", str(marker)],
            capture_output=True,
            text=True,
            timeout=30,
            pass_fds=(fd,),
            env={"PATH": "/usr/bin:/bin"},
        )
    assert done.returncode == FAILED_EXIT
    assert done.stderr.startswith("sandcell-launch: cannot enter the mount namespace")
    assert not marker.exists()
