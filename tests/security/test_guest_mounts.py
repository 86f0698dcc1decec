"""The guest helper's mounts on every runtime: what a job may reach of them, and no more.

`import sandcell_guest` works in every job; the package and the attempt's channel directory
are read-only; committed stage files come back under /output owned by the guest, before the
program starts; a stage that no longer fits the disk fails the start, never half-restores.
"""

import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

import pytest

from sandcell.app import guest_channels
from sandcell.domain.errors import RuntimeUnavailable
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import GUEST_CHANNEL_DIR, InputFile, SandboxSpec
from sandcell.ports.sessions import GUEST_PACKAGE_DIR
from sandcell.runtime.guest_mounts import (
    ensure_guest_package,
    oci_guest_mounts,
    release_guest_package,
)
from sandcell.runtime.images import build_image
from sandcell.runtime.reap import is_mount_point
from tests.integration.conftest import IMAGE_DIR, RecordingSink
from tests.security.conftest import AnyRuntime, assert_released

ENV = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "/opt/sandcell", "SANDCELL_COMPLETED_STAGES": "clean"}
RESUMED_JOB = """
import os
import sandcell_guest as guest

print(guest.completed_stages())
print(open("/output/clean.csv").read() == "a,b\\n", os.stat("/output/deep/er/x.txt").st_uid)
open("/output/chart.svg", "w").write("<svg/>")
guest.commit_stage("chart", files=["chart.svg"])
for _ in range(2):
    with guest.once("notify"):
        print("notified")
for path in ("/run/sandcell/guest/evil", "/opt/sandcell/evil.py", "/opt/sandcell/__init__.py"):
    try:
        open(path, "w")
        print("WROTE", path)
    except OSError:
        print("refused")
"""


class MemoryRecorder:
    """What the worker's StageRecorder would be asked, kept in memory."""

    def __init__(self) -> None:
        self.stages: dict[str, dict[str, bytes]] = {}
        self.once_keys: list[str] = []

    def commit_stage(self, name: str, files: list[tuple[str, BinaryIO]]) -> list[dict[str, object]]:
        self.stages[name] = {path: content.read() for path, content in files}
        return [{"path": path, "size": len(data)} for path, data in self.stages[name].items()]

    def once(self, key: str) -> bool:
        first = key not in self.once_keys
        self.once_keys += [key] if first else []
        return first

    def completed(self) -> list[str]:
        return list(self.stages)


def _spec(image: Image, sandbox_id: str, code: str, **extra: object) -> SandboxSpec:
    argv = [image.python, "/job/main.py"]
    return SandboxSpec(sandbox_id, image, argv, ENV, Limits(), code.encode(), **extra)  # type: ignore[arg-type]


def _stage_files(tmp: Path) -> list[InputFile]:
    (tmp / "clean.csv").write_text("a,b\n")
    (tmp / "x.txt").write_text("x")
    return [InputFile(tmp / "clean.csv", "clean.csv"), InputFile(tmp / "x.txt", "deep/er/x.txt")]


@pytest.fixture(params=["python", "python-data"])
def guest_image(request: pytest.FixtureRequest, python_image: Image) -> Image:
    """Every approved image carries the guest helper's mount points and runs it alike."""
    return python_image if request.param == "python" else build_image(request.param, IMAGE_DIR)


def test_a_resumed_job_gets_its_stages_back_and_a_read_only_channel(
    runtime: AnyRuntime, guest_image: Image, tmp_path: Path
) -> None:
    # Where a worker makes them (on sandcell's tmpfs), keyed by the runtime's state dir.
    channels = guest_channels(runtime.state_dir)
    recorder = MemoryRecorder()
    sandbox_id = f"g-resumed-{guest_image.name}"
    channel = channels.open(sandbox_id, recorder)  # type: ignore[arg-type]
    spec = _spec(
        guest_image,
        sandbox_id,
        RESUMED_JOB,
        guest_channel=channel.directory,
        restore_outputs=_stage_files(tmp_path),
    )
    sink = RecordingSink()
    try:
        result = runtime.run(spec, sink, threading.Event())
    finally:
        channel.close()
        channels.close()  # as the worker does when it stops: nothing left on the tmpfs
    assert result.reason is None and result.released, (result, sink.stderr)
    assert sink.stdout.splitlines() == [
        "['clean']",
        "True 65534",
        "notified",  # once: the second pass skipped the block
        *["refused"] * 3,
    ]
    assert recorder.stages == {"chart": {"chart.svg": b"<svg/>"}}
    assert recorder.once_keys == ["notify"]
    assert sink.files["clean.csv"] == b"a,b\n"  # restored files are outputs like any other
    assert_released(runtime, spec.sandbox_id)


def test_without_a_channel_the_helper_imports_and_refuses_clearly(
    runtime: AnyRuntime, python_image: Image
) -> None:
    code = "import sandcell_guest as g\ntry: g.commit_stage('x')\nexcept Exception as e: print(e)"
    sink = RecordingSink()
    result = runtime.run(_spec(python_image, "g-nochannel", code), sink, threading.Event())
    assert result.reason is None, sink.stderr
    assert sink.stdout == "this sandbox has no guest channel\n"


def test_stages_that_do_not_fit_the_disk_fail_the_start(
    runtime: AnyRuntime, python_image: Image, tmp_path: Path
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (12 << 20))
    spec = _spec(python_image, "g-toobig", "print('ran')", restore_outputs=[InputFile(big, "b")])
    spec = replace(spec, limits=Limits(disk_mb=8))
    sink = RecordingSink()
    result = runtime.run(spec, sink, threading.Event())
    assert result.reason is Reason.RUNTIME_ERROR and result.released
    assert "cannot start the sandbox" in result.detail and sink.stdout == ""
    assert_released(runtime, spec.sandbox_id)


HOSTILE_JOB = """
import json, socket

def ask(request, payload=b""):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect("/run/sandcell/guest/guest.sock")
        conn.sendall(json.dumps(request).encode() + b"\\n" + payload)
        print(json.loads(conn.makefile("rb").readline())["ok"])

OTHER = "OTHER_JOB"
ask({"op": "once", "key": "k", "job_id": OTHER})
ask({"op": "once", "key": "k", "token": 1, "sandbox_id": OTHER})
ask({"op": "completed_stages", "job": OTHER})
ask({"op": "commit_stage", "name": "s", "files": [], "job_id": OTHER})
ask({"op": "commit_stage", "name": "s", "files": [{"path": "x", "size": 1, "job": OTHER}]}, b"x")
ask({"op": "once", "key": "k"})
"""


def test_a_guest_request_naming_another_job_cannot_touch_it(
    runtime: AnyRuntime, python_image: Image
) -> None:
    channels = guest_channels(runtime.state_dir)
    mine, other = MemoryRecorder(), MemoryRecorder()
    other_channel = channels.open("g-other", other)  # type: ignore[arg-type]
    channel = channels.open("g-hostile", mine)  # type: ignore[arg-type]
    code = HOSTILE_JOB.replace("OTHER_JOB", "g-other")
    spec = _spec(python_image, "g-hostile", code, guest_channel=channel.directory)
    sink = RecordingSink()
    try:
        result = runtime.run(spec, sink, threading.Event())
    finally:
        channel.close()
        other_channel.close()
        channels.close()
    assert result.reason is None and result.released, (result, sink.stderr)
    assert sink.stdout.split() == ["False"] * 5 + ["True"]  # refused whole; then its own
    assert (mine.stages, mine.once_keys) == ({}, ["k"])
    assert (other.stages, other.once_keys) == ({}, [])
    assert_released(runtime, spec.sandbox_id)


@pytest.fixture
def image_root(tmp_path: Path) -> Iterator[Path]:
    """An image root with the package's mount point (a space in its path, as mountinfo escapes
    it); whatever gets mounted there is undone."""
    rootfs = tmp_path / "image root"
    target = rootfs / GUEST_PACKAGE_DIR.lstrip("/")
    target.mkdir(parents=True)
    yield rootfs
    while is_mount_point(target):
        subprocess.run(["umount", "-l", str(target)], check=True)


def test_the_package_is_bound_once_read_only_into_the_image_root(image_root: Path) -> None:
    """Every sandbox of the image sees it through its root: no mount of its own per sandbox."""
    target = image_root / GUEST_PACKAGE_DIR.lstrip("/")
    ensure_guest_package(image_root)
    assert is_mount_point(target) and (target / "sandcell_guest.py").is_file()
    flags = os.statvfs(target).f_flag
    for flag in (os.ST_RDONLY, os.ST_NOSUID, os.ST_NODEV, os.ST_NOEXEC):
        assert flags & flag, flag
    with pytest.raises(OSError) as refused:
        (target / "evil.py").write_text("x")
    assert refused.value.errno == errno.EROFS
    ensure_guest_package(image_root)
    mounts = Path("/proc/self/mountinfo").read_text().split("\n")
    escaped = str(target).replace(" ", "\\040")
    assert sum(f" {escaped} " in line for line in mounts) == 1  # not stacked


def test_a_package_bound_by_an_earlier_install_is_replaced(
    image_root: Path, tmp_path: Path
) -> None:
    target = image_root / GUEST_PACKAGE_DIR.lstrip("/")
    old = tmp_path / "old-guest"
    old.mkdir()
    (old / "stale.py").write_text("")
    subprocess.run(["mount", "--bind", str(old), str(target)], check=True)
    ensure_guest_package(image_root)
    assert (target / "sandcell_guest.py").is_file() and not (target / "stale.py").exists()
    assert os.statvfs(target).f_flag & os.ST_RDONLY


def test_a_gvisor_sandbox_has_no_mount_of_its_own_for_the_package(python_image: Image) -> None:
    spec = _spec(python_image, "g-mounts", "print(1)", guest_channel=Path("/nonexistent"))
    assert [m["destination"] for m in oci_guest_mounts(spec)] == [GUEST_CHANNEL_DIR]
    assert oci_guest_mounts(replace(spec, guest_channel=None)) == []


def test_a_root_about_to_be_removed_lets_go_of_the_package(image_root: Path) -> None:
    target = image_root / GUEST_PACKAGE_DIR.lstrip("/")
    ensure_guest_package(image_root)
    release_guest_package(image_root)
    assert not is_mount_point(target) and list(target.iterdir()) == []
    release_guest_package(image_root)  # nothing bound: nothing to do


def test_a_broken_image_without_the_mount_point_is_left_to_the_start(tmp_path: Path) -> None:
    ensure_guest_package(tmp_path / "no-such-root")  # the sandbox's start reports it
    assert not (tmp_path / "no-such-root").exists()


def test_a_mount_point_that_leads_out_of_the_image_root_is_refused(tmp_path: Path) -> None:
    """A symlink in an image (opt/sandcell -> a host directory) must never get the host's
    directory covered, nor a mount there detached."""
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    (host_dir / "keep.txt").write_text("host")
    rootfs = tmp_path / "image root"
    (rootfs / "opt").mkdir(parents=True)
    (rootfs / GUEST_PACKAGE_DIR.lstrip("/")).symlink_to(host_dir)
    with pytest.raises(RuntimeUnavailable, match="leads out of the image root"):
        ensure_guest_package(rootfs)
    with pytest.raises(RuntimeUnavailable, match="leads out of the image root"):
        release_guest_package(rootfs)
    assert not is_mount_point(host_dir) and (host_dir / "keep.txt").read_text() == "host"
