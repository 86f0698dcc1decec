"""Scratch disks copied from a blank image, on real loop devices (ext4.py, scratch.py)."""

import os
from pathlib import Path

import pytest

from sandcell.ports.runtime import InputFile
from sandcell.runtime.ext4 import BlankDisks, ScratchError, attach_loop, copy_sparse, inodes_for
from sandcell.runtime.scratch import (
    GUEST_UID,
    Scratch,
    attached_loops,
    loop_backing_file,
    scratch_blanks,
)
from sandcell.runtime.session_volume import SessionScratch

MiB = 1024 * 1024
BLANK_16M = "ext4-16m-1024i-workspace-output-65534.img"  # its size, inodes and layout
BLANK_8M = "ext4-8m-512i-workspace-output-65534.img"


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: loop devices and mounts")


def _scratch(tmp_path: Path, name: str, blanks: BlankDisks, disk_mb: int = 16) -> Scratch:
    scratch = Scratch(tmp_path / "sandboxes" / name, blanks)
    scratch.root.parent.mkdir(exist_ok=True)
    assert scratch.claim()
    scratch.create(b"print(1)", [], disk_mb)
    return scratch


def test_a_blank_is_made_once_per_size_and_each_disk_is_a_sparse_copy(tmp_path: Path) -> None:
    blanks = scratch_blanks(tmp_path / "blanks")
    first = _scratch(tmp_path, "a", blanks)
    made = {p.name: p.stat().st_ino for p in blanks.directory.iterdir()}
    second = _scratch(tmp_path, "b", blanks)
    other_size = _scratch(tmp_path, "c", blanks, disk_mb=8)
    try:
        assert made == {BLANK_16M: made[BLANK_16M]}
        names = {p.name for p in blanks.directory.iterdir()}
        assert names == {BLANK_16M, BLANK_8M}  # no partial file left
        for scratch, disk_mb in ((first, 16), (second, 16), (other_size, 8)):
            assert scratch.image.stat().st_size == disk_mb * MiB
            assert scratch.image.stat().st_blocks * 512 < disk_mb * MiB // 4  # holes stayed
            fs = os.statvfs(scratch.disk)
            assert fs.f_files == inodes_for(disk_mb)
            assert fs.f_blocks * fs.f_frsize > (disk_mb - 2) * MiB  # -m 0: all of it the guest's
            assert (scratch.workspace.stat().st_uid, scratch.output.stat().st_uid) == (
                GUEST_UID,
                GUEST_UID,
            )
            assert loop_backing_file(str(scratch.loop_device)) == str(scratch.image)
    finally:
        problems = [p for s in (first, second, other_size) for p in s.teardown()]
    assert problems == []
    assert not any(str(tmp_path) in backing for backing in attached_loops().values())


def test_two_disks_from_one_blank_share_nothing(tmp_path: Path) -> None:
    blanks = scratch_blanks(tmp_path / "blanks")
    first, second = _scratch(tmp_path, "a", blanks), _scratch(tmp_path, "b", blanks)
    try:
        (first.workspace / "secret.txt").write_text("only a's")
        os.sync()
        assert list(second.workspace.iterdir()) == []
        assert first.loop_device != second.loop_device
        third = _scratch(tmp_path, "c", blanks)  # copied after a's write: still blank
        assert list(third.workspace.iterdir()) == []
        assert third.teardown() == []
    finally:
        assert first.teardown() == [] and second.teardown() == []


def test_a_truncated_blank_is_made_again(tmp_path: Path) -> None:
    blanks = scratch_blanks(tmp_path / "blanks")
    blanks.directory.mkdir()
    (blanks.directory / BLANK_16M).write_bytes(b"half")  # a crash mid-write, say
    scratch = _scratch(tmp_path, "a", blanks)
    try:
        assert scratch.is_mounted()
        assert (blanks.directory / BLANK_16M).stat().st_size == 16 * MiB
    finally:
        assert scratch.teardown() == []


def test_copy_sparse_copies_the_data_and_keeps_the_holes(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    with open(source, "wb") as out:
        out.truncate(64 * MiB)
        out.seek(10 * MiB)
        out.write(b"a" * 5000)
        out.seek(64 * MiB - 3)
        out.write(b"end")
    copy_sparse(source, target)
    assert target.read_bytes() == source.read_bytes()
    assert target.stat().st_blocks * 512 <= 256 * 1024
    with pytest.raises(FileExistsError):  # never over an existing file
        copy_sparse(source, target)


def test_attach_loop_refuses_what_is_not_there(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        attach_loop(tmp_path / "missing.img")
    assert not any(str(tmp_path) in backing for backing in attached_loops().values())


def test_a_blank_that_cannot_be_made_is_a_scratch_error(tmp_path: Path) -> None:
    blanks = scratch_blanks(tmp_path / "blanks")
    with pytest.raises(ScratchError, match="mkfs"):
        blanks.copy(0, tmp_path / "disk.img")  # a 0-byte image: mkfs.ext4 refuses it
    assert list(blanks.directory.iterdir()) == []  # its partial file is gone


def test_a_spill_holds_the_disk_image_and_inputs_and_goes_with_the_scratch(
    tmp_path: Path,
) -> None:
    blanks = scratch_blanks(tmp_path / "blanks")
    small, big = tmp_path / "small", tmp_path / "big"
    small.mkdir(), big.mkdir()
    host_input = tmp_path / "in.csv"
    host_input.write_text("a,b\n")
    scratch = Scratch(small / "s-1", blanks, spill=big / "s-1")
    assert scratch.claim()
    try:
        scratch.create(b"print(1)", [InputFile(host_input, "data/in.csv")], 16)
        assert scratch.image == big / "s-1" / "disk.img"
        assert (big / "s-1" / "input" / "data" / "in.csv").read_text() == "a,b\n"
        assert loop_backing_file(str(scratch.loop_device)) == str(scratch.image)
        assert {p.name for p in (small / "s-1").iterdir()} == {"bundle", "job", "disk"}
        assert scratch.workspace.stat().st_dev != small.stat().st_dev  # the mounted disk
    finally:
        assert scratch.teardown() == []
    assert list(small.iterdir()) == list(big.iterdir()) == []


def test_a_leftover_spill_means_the_id_is_taken(tmp_path: Path) -> None:
    (tmp_path / "big" / "s-1").mkdir(parents=True)  # what a crash left, say
    (tmp_path / "small").mkdir()
    scratch = Scratch(tmp_path / "small" / "s-1", spill=tmp_path / "big" / "s-1")
    assert not scratch.claim()
    assert list((tmp_path / "small").iterdir()) == []  # its root was not kept either


def _mount_options(target: Path) -> set[str]:
    """The options /proc/self/mounts shows for the filesystem mounted at `target`."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mount_point, _, options, *_ = line.split()
        if mount_point == str(target):
            return set(options.split(","))
    raise AssertionError(f"nothing mounted at {target}")


def test_a_jobs_throwaway_disk_goes_without_barriers_and_a_sessions_volume_keeps_them(
    tmp_path: Path,
) -> None:
    """A job's disk is unmounted without flushing onto the host's disk; a session's volume is
    used again after its sandbox, and after a crash, so it keeps ext4's barriers."""
    scratch = _scratch(tmp_path, "s-1", scratch_blanks(tmp_path / "blanks"))
    try:
        assert {"nobarrier", "nosuid", "nodev", "noatime"} <= _mount_options(scratch.disk)
    finally:
        assert scratch.teardown() == []
    volume = SessionScratch(tmp_path / "sandboxes" / "v-1", volume=tmp_path / "workspace.img")
    assert volume.claim()
    volume.create_session(16)
    try:
        options = _mount_options(volume.disk)
        assert "nobarrier" not in options and {"nosuid", "nodev", "noatime"} <= options
    finally:
        assert volume.teardown() == []


def test_a_disk_formatted_in_place_has_the_copied_ones_layout(tmp_path: Path) -> None:
    copied = _scratch(tmp_path, "a", scratch_blanks(tmp_path / "blanks"))
    in_place = Scratch(tmp_path / "sandboxes" / "b")  # no blanks: mkfs for this disk alone
    assert in_place.claim()
    in_place.create(b"print(1)", [], 16)
    try:
        for scratch in (copied, in_place):
            made = (scratch.disk, scratch.workspace, scratch.output)
            owners = [(p.stat().st_uid, p.stat().st_mode & 0o777) for p in made]
            assert owners == [(0, 0o755), (GUEST_UID, 0o755), (GUEST_UID, 0o755)]
            assert sorted(p.name for p in scratch.disk.iterdir()) == [
                "lost+found",
                "output",
                "workspace",
            ]
    finally:
        assert copied.teardown() == [] and in_place.teardown() == []
