"""The guest helper's mounts on every runtime: what a job may reach of them, and no more.

`import sandcell_guest` works in every job; the package and the attempt's channel directory
are read-only; committed stage files come back under /output owned by the guest, before the
program starts; a stage that no longer fits the disk fails the start, never half-restores.
"""

import threading
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import InputFile, SandboxSpec
from sandcell.remote.guest_channel import SocketGuestChannels
from tests.integration.conftest import RecordingSink
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


def test_a_resumed_job_gets_its_stages_back_and_a_read_only_channel(
    runtime: AnyRuntime, python_image: Image, tmp_path: Path
) -> None:
    # Under the runtime's state dir: bwrap opens bind sources as the sandbox's own host uid.
    channels = SocketGuestChannels(runtime.state_dir / "channels")
    recorder = MemoryRecorder()
    channel = channels.open("g-resumed", recorder)  # type: ignore[arg-type]
    spec = _spec(
        python_image,
        "g-resumed",
        RESUMED_JOB,
        guest_channel=channel.directory,
        restore_outputs=_stage_files(tmp_path),
    )
    sink = RecordingSink()
    try:
        result = runtime.run(spec, sink, threading.Event())
    finally:
        channel.close()
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
