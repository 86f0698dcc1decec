"""The tmpfs a runtime keeps its small, per-sandbox files on (volatile.py)."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.app import guest_channels
from sandcell.runtime.reap import mounts_under
from sandcell.runtime.volatile import RUN_ROOT, ensure_tmpfs, volatile_dir


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts")
    root = tmp_path / "run" / "sandcell"
    yield root
    for point in mounts_under(str(root)):
        subprocess.run(["umount", point], check=True)


def test_a_tmpfs_is_mounted_once_whoever_asks(root: Path) -> None:
    ask = (
        "from pathlib import Path; from sandcell.runtime.volatile import ensure_tmpfs; "
        f"ensure_tmpfs(Path({str(root)!r}))"
    )
    for _ in range(2):  # other processes: this one's memo of what is mounted does not help
        subprocess.run([sys.executable, "-c", ask], check=True)
    ensure_tmpfs(root)
    assert mounts_under(str(root)) == [str(root)]  # one mount, never one stacked on another
    found = subprocess.run(["findmnt", "-no", "FSTYPE,OPTIONS", str(root)], capture_output=True)
    fs_type, options = found.stdout.decode().split()
    assert fs_type == "tmpfs" and {"nosuid", "nodev"} <= set(options.split(","))
    assert oct(root.stat().st_mode & 0o777) == "0o711"  # bwrap's uids get through, not in


def test_each_state_dir_has_its_own_volatile_dir(tmp_path: Path) -> None:
    first, second = volatile_dir(tmp_path / "a"), volatile_dir(tmp_path / "b")
    assert first != second and first.parent == second.parent
    assert volatile_dir(tmp_path / "a" / ".." / "a") == first  # the same dir, however named


def test_a_workers_guest_channels_are_on_the_tmpfs(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: mounts")
    channels = guest_channels(tmp_path / "data")
    found = subprocess.run(
        ["findmnt", "-no", "FSTYPE", "--target", str(channels.root)], capture_output=True
    )
    assert found.stdout.decode().strip() == "tmpfs"
    assert channels.root.parent == RUN_ROOT and channels.root.is_dir()
    assert not (tmp_path / "data").exists()  # nothing of them on the data dir's disk
    channels.close()  # the worker stopped: nothing of it is left on the tmpfs either
    assert not channels.root.exists()
