"""Fixtures for the real gVisor runtime over the real `python` image (built once, idempotent)."""

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import pytest

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.egress import EgressAttachment
from sandcell.ports.runtime import InputFile, SandboxResult, SandboxSpec
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.images import build_image
from sandcell.runtime.scratch import attached_loops

IMAGE_DIR = Path(os.environ.get("SANDCELL_IMAGE_DIR", "/var/lib/sandcell/images"))
# HOME and PWD as a job has them (the worker's base environment): so a job's code starts as
# in service (gVisor: the as_script bootstrap, see bundle.program; bwrap: as it is, see
# bwrap_run.command).
GUEST_ENV = {
    "PATH": "/usr/bin:/bin",
    "PYTHONUNBUFFERED": "1",
    "LANG": "C.UTF-8",
    "HOME": "/workspace",
    "PWD": "/workspace",
}


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: runsc, cgroups and loop devices")


@pytest.fixture(scope="session")
def python_image() -> Image:
    _require_root()
    return build_image("python", IMAGE_DIR)


@pytest.fixture(scope="session")
def python_data_image() -> Image:
    """numpy, pandas, matplotlib and IPython (session kernels); built once, ~2 min."""
    _require_root()
    return build_image("python-data", IMAGE_DIR)


@pytest.fixture(scope="session")
def gvisor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GVisorRuntime]:
    _require_root()
    runtime = GVisorRuntime(tmp_path_factory.mktemp("gvisor-state"))
    runtime.check()
    yield runtime
    runtime.reap()
    runtime.close()  # its parent cgroup and its directory under /run/sandcell


@dataclass
class RecordingSink:
    """Everything a sandbox reported, with the order of `ready` against the output."""

    events: list[tuple[str, bytes]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    ready_at: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ready(self) -> None:
        with self._lock:
            self.ready_at = time.monotonic()
            self.events.append(("ready", b""))

    def output(self, stream: str, data: bytes) -> None:
        with self._lock:
            self.events.append((stream, data))

    def output_file(self, path: str, content: BinaryIO, size: int) -> None:
        self.files[path] = content.read()
        self.sizes[path] = size

    def text(self, stream: str) -> str:
        return b"".join(d for s, d in self.events if s == stream).decode("utf-8", "replace")

    @property
    def stdout(self) -> str:
        return self.text("stdout")

    @property
    def stderr(self) -> str:
        return self.text("stderr")


@dataclass
class Ran:
    result: SandboxResult
    sink: RecordingSink
    spec: SandboxSpec


RunCode = Callable[..., Ran]


@pytest.fixture
def run_code(gvisor: GVisorRuntime, python_image: Image, request: pytest.FixtureRequest) -> RunCode:
    """Run Python `code` in a fresh sandbox; also assert that nothing of it is left behind."""
    counter = iter(range(1000))

    def run(
        code: str,
        *,
        env: dict[str, str] | None = None,
        inputs: list[InputFile] | None = None,
        cancel: threading.Event | None = None,
        argv: list[str] | None = None,
        sink: RecordingSink | None = None,
        egress: EgressAttachment | None = None,
        **limits: float,
    ) -> Ran:
        sandbox_id = f"t-{request.node.name[:40].strip('_')}-{next(counter)}".replace("[", "-")
        spec = SandboxSpec(
            sandbox_id=sandbox_id.replace("]", ""),
            image=python_image,
            argv=argv or [python_image.python, "/job/main.py"],
            env=GUEST_ENV if env is None else env,
            limits=Limits(**limits),  # type: ignore[arg-type]
            code=code.encode(),
            inputs=inputs or [],
            egress=egress,
        )
        sink = sink or RecordingSink()
        result = gvisor.run(spec, sink, cancel or threading.Event())
        assert_released(gvisor, spec.sandbox_id)
        return Ran(result, sink, spec)

    return run


def assert_released(runtime: GVisorRuntime, sandbox_id: str) -> None:
    scratch, disk = runtime.sandboxes_dir / sandbox_id, runtime.disks_dir / sandbox_id
    assert not scratch.exists(), f"scratch {scratch} left behind"
    assert not disk.exists(), f"disk directory {disk} left behind"
    assert not runtime.runsc.has_state(sandbox_id), "runsc still has the container"
    for controller in ("memory", "cpu", "cpuacct", "pids"):
        path = Path("/sys/fs/cgroup", controller, runtime.cgroup_parent, sandbox_id)
        assert not path.exists(), f"cgroup {path} left behind"
    assert not [b for b in attached_loops().values() if b.startswith((str(scratch), str(disk)))]
    assert not host_processes_mentioning(sandbox_id)


def host_processes_mentioning(text: str) -> list[str]:
    """Command lines of host processes that mention `text` (the sandbox id)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (
                (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
            )
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found
