"""Scratch disks kept between sandboxes (disk_shelf.py), on real loop devices and mounts."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandcell.runtime.disk_shelf import MAX_FILES_TO_EMPTY, DiskShelf
from sandcell.runtime.reap import mounts_under, reap_scratch
from sandcell.runtime.scratch import GUEST_UID, Scratch, attached_loops, scratch_blanks
from sandcell.runtime.settle import settled

JOB_UID = 4242  # what a bwrap job's disk is chowned to


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: loop devices and mounts")


@pytest.fixture
def shelf(tmp_path: Path) -> Iterator[DiskShelf]:
    sandboxes, disks = tmp_path / "sandboxes", tmp_path / "disks"
    sandboxes.mkdir()
    disks.mkdir()
    shelf = DiskShelf(sandboxes, disks, scratch_blanks(tmp_path / "blanks"))
    yield shelf
    assert shelf.close() == []
    assert not mounts_under(f"{tmp_path}/")
    assert not [b for b in attached_loops().values() if b.startswith(f"{tmp_path}/")]


def _job(shelf: DiskShelf, name: str, disk_mb: int = 16, owner: int | None = JOB_UID) -> Scratch:
    """A job's scratch as a bwrap run prepares it, its disk from `shelf` (`owner`: the uid its
    directories are given to; None: left as they came)."""
    scratch = Scratch(shelf.sandboxes_dir / name, shelf.blanks, shelf=shelf)
    assert scratch.claim()
    scratch.create(b"print(1)", [], disk_mb)
    for path in (scratch.workspace, scratch.output):
        if owner is not None:
            os.chown(path, owner, owner)
    return scratch


def _leave_traces(scratch: Scratch) -> None:
    """What a hostile job can do to its own directories."""
    (scratch.workspace / "secret.txt").write_text("job 1's data")
    (scratch.output / "result.csv").write_text("a,b\n")
    os.mkfifo(scratch.workspace / "fifo")
    os.symlink("/etc/passwd", scratch.workspace / "link")
    locked = scratch.workspace / "locked"
    locked.mkdir()
    (locked / "inner").write_text("x")
    locked.chmod(0)
    os.setxattr(scratch.workspace, "user.mark", b"job 1")
    scratch.output.chmod(0o777)


def test_a_gone_sandboxes_disk_comes_back_empty_as_a_blank_to_the_next(shelf: DiskShelf) -> None:
    first = _job(shelf, "job-1")
    mount = first.disk
    assert mount.parent.name.startswith(".disk-") and first.is_mounted()
    _leave_traces(first)
    assert first.teardown(reusable=True) == []
    assert not first.root.exists() and shelf.kept() == 1

    second = _job(shelf, "job-2", owner=None)
    try:
        assert second.disk == mount  # the same disk, still mounted
        for top in (second.workspace, second.output):
            assert list(top.iterdir()) == []
            assert os.listxattr(top) == []
        assert second.workspace.stat().st_uid == GUEST_UID  # as a blank's, before the chown
        fresh = _job(shelf, "job-3", owner=None)  # a new disk: nothing kept is left
        try:
            assert fresh.disk != mount
            for kept, new in ((second.workspace, fresh.workspace), (second.output, fresh.output)):
                assert (kept.stat().st_mode, kept.stat().st_uid) == (
                    new.stat().st_mode,
                    new.stat().st_uid,
                )
            assert os.statvfs(second.disk).f_ffree == os.statvfs(fresh.disk).f_ffree
            assert os.statvfs(second.disk).f_bfree == os.statvfs(fresh.disk).f_bfree
        finally:
            assert fresh.teardown() == []
    finally:
        assert second.teardown() == []
    assert shelf.kept() == 0  # neither was given back as reusable


def test_a_disk_whose_sandbox_may_live_on_is_torn_down(shelf: DiskShelf, tmp_path: Path) -> None:
    scratch = _job(shelf, "job-1")
    backing = str(scratch.kept.scratch.image) if scratch.kept else ""
    assert scratch.teardown(reusable=False) == []
    assert shelf.kept() == 0
    assert backing not in attached_loops().values()
    assert not mounts_under(f"{tmp_path}/")


def test_a_disk_with_many_files_or_a_still_open_one_is_not_kept(shelf: DiskShelf) -> None:
    crowded = _job(shelf, "crowded")
    for n in range(MAX_FILES_TO_EMPTY + 1):
        (crowded.workspace / f"f{n}").touch()
    assert crowded.teardown(reusable=True) == []
    assert shelf.kept() == 0

    holder = _job(shelf, "holder")
    held = (holder.workspace / "held").open("w")  # deleted but open: its inode stays taken
    held.write("x" * 100_000)
    held.flush()
    holder.teardown(reusable=True)  # not kept: torn down, as far as the open file lets it
    assert shelf.kept() == 0
    held.close()
    assert settled(lambda: holder.teardown(reusable=True) == [], 5)  # as teardown_scratch
    assert shelf.kept() == 0


def test_a_kept_disk_of_another_size_is_not_handed_out(shelf: DiskShelf) -> None:
    small = _job(shelf, "small", disk_mb=8)
    mount = small.disk
    assert small.teardown(reusable=True) == []
    large = _job(shelf, "large", disk_mb=16)
    try:
        assert large.disk != mount
        assert os.statvfs(large.disk).f_blocks * os.statvfs(large.disk).f_frsize > 12 << 20
    finally:
        assert large.teardown(reusable=True) == []
    assert shelf.kept() == 2


def test_kept_disks_of_a_crashed_worker_are_reaped(shelf: DiskShelf, tmp_path: Path) -> None:
    scratch = _job(shelf, "job-1")
    assert scratch.teardown(reusable=True) == [] and shelf.kept() == 1
    removed = reap_scratch(shelf.sandboxes_dir, shelf.disks_dir)  # as a new worker's start
    assert any(item.startswith("mount ") for item in removed)
    assert not mounts_under(f"{tmp_path}/")
    assert list(shelf.sandboxes_dir.iterdir()) == list(shelf.disks_dir.iterdir()) == []
    # The shelf of the crashed process would find its disk gone, and make a new one.
    again = _job(shelf, "job-2")
    try:
        assert again.is_mounted() and list(again.workspace.iterdir()) == []
    finally:
        assert again.teardown() == []
