"""One security suite, every runtime: the same hostile programs through `Runtime.run`.

`runtime` is parametrised over the real gVisor and bwrap runtimes (marks `gvisor`, `bwrap`);
every run also asserts that nothing of the sandbox is left on the host.
"""

import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.egress import EgressAttachment
from sandcell.ports.runtime import InputFile, SandboxResult, SandboxSpec
from sandcell.runtime.bwrap import BwrapRuntime
from sandcell.runtime.bwrap_run import processes_by_uid
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.images import build_image
from sandcell.runtime.scratch import attached_loops
from tests.integration.conftest import GUEST_ENV, IMAGE_DIR, RecordingSink

CONTROLLERS = ("memory", "cpu", "cpuacct", "pids")
AnyRuntime = GVisorRuntime | BwrapRuntime


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: runtimes, cgroups and loop devices")


@pytest.fixture(scope="session")
def python_image() -> Image:
    _require_root()
    return build_image("python", IMAGE_DIR)


@pytest.fixture(scope="session")
def runtimes() -> Iterator[dict[str, AnyRuntime]]:
    """Each runtime is made (and checked, failing closed) the first time a test asks for it."""
    made: dict[str, AnyRuntime] = {}
    yield made
    for runtime in made.values():
        runtime.reap()
        runtime.close()  # its parent cgroup and its directory under /run/sandcell
        shutil.rmtree(runtime.state_dir, ignore_errors=True)


def _make(name: str) -> AnyRuntime:
    # Not under pytest's 0700 temp dir: bwrap runs as the sandbox's uid and must get through.
    state_dir = Path(tempfile.mkdtemp(prefix=f"sandcell-{name}-", dir="/var/tmp"))
    state_dir.chmod(0o711)
    runtime: AnyRuntime = GVisorRuntime(state_dir) if name == "gvisor" else BwrapRuntime(state_dir)
    runtime.check()
    return runtime


@pytest.fixture(
    params=[
        pytest.param("gvisor", marks=pytest.mark.gvisor),
        pytest.param("bwrap", marks=pytest.mark.bwrap),
    ]
)
def runtime(request: pytest.FixtureRequest, runtimes: dict[str, AnyRuntime]) -> AnyRuntime:
    _require_root()
    name: str = request.param
    if name not in runtimes:
        runtimes[name] = _make(name)
    return runtimes[name]


@pytest.fixture(scope="session")
def bwrap(runtimes: dict[str, AnyRuntime]) -> BwrapRuntime:
    """The bwrap runtime alone, for what only its seccomp filter promises."""
    _require_root()
    if "bwrap" not in runtimes:
        runtimes["bwrap"] = _make("bwrap")
    made = runtimes["bwrap"]
    assert isinstance(made, BwrapRuntime)
    return made


@dataclass
class Ran:
    result: SandboxResult
    sink: RecordingSink
    spec: SandboxSpec


RunCode = Callable[..., Ran]


def make_runner(runtime: AnyRuntime, image: Image, request: pytest.FixtureRequest) -> RunCode:
    counter = iter(range(1000))
    name = request.node.name[:40].strip("_")

    def run(
        code: str,
        *,
        env: dict[str, str] | None = None,
        argv: list[str] | None = None,
        egress: EgressAttachment | None = None,
        inputs: list[InputFile] | None = None,
        cancel: threading.Event | None = None,
        sink: RecordingSink | None = None,
        sandbox_id: str | None = None,
        **limits: float,
    ) -> Ran:
        sandbox_id = sandbox_id or f"s-{name}-{next(counter)}"
        for char in "[]":
            sandbox_id = sandbox_id.replace(char, "-")
        spec = SandboxSpec(
            sandbox_id=sandbox_id.strip("-"),
            image=image,
            argv=argv or [image.python, "/job/main.py"],
            env=GUEST_ENV if env is None else env,
            limits=Limits(**limits),  # type: ignore[arg-type]
            code=code.encode(),
            inputs=inputs or [],
            egress=egress,
        )
        sink = sink or RecordingSink()
        result = runtime.run(spec, sink, cancel or threading.Event())
        assert result.released, result.detail
        assert_released(runtime, spec.sandbox_id)
        return Ran(result, sink, spec)

    return run


@pytest.fixture
def run_code(runtime: AnyRuntime, python_image: Image, request: pytest.FixtureRequest) -> RunCode:
    return make_runner(runtime, python_image, request)


@pytest.fixture
def run_bwrap(bwrap: BwrapRuntime, python_image: Image, request: pytest.FixtureRequest) -> RunCode:
    return make_runner(bwrap, python_image, request)


def cgroup_relpath(runtime: AnyRuntime, sandbox_id: str) -> str:
    return f"{runtime.cgroup_parent}/{sandbox_id}"


def processes_of_uid(uid: int) -> list[int]:
    """Live host processes whose real uid is `uid`."""
    return processes_by_uid(uid, 1).get(uid, [])


def processes_in_cgroup(relpath: str) -> list[int]:
    """Host pids whose cgroup (any controller) is `relpath`, read from /proc itself."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            membership = (entry / "cgroup").read_text()
        except OSError:
            continue
        if f":/{relpath}\n" in membership:
            found.append(int(entry.name))
    return found


def assert_released(runtime: AnyRuntime, sandbox_id: str) -> None:
    scratch, disk = runtime.sandboxes_dir / sandbox_id, runtime.disks_dir / sandbox_id
    assert not scratch.exists(), f"scratch {scratch} left behind"
    assert not disk.exists(), f"disk directory {disk} left behind"
    relpath = cgroup_relpath(runtime, sandbox_id)
    for controller in CONTROLLERS:
        path = Path("/sys/fs/cgroup", controller, relpath)
        assert not path.exists(), f"cgroup {path} left behind"
    assert not processes_in_cgroup(relpath)
    assert not [b for b in attached_loops().values() if b.startswith((str(scratch), str(disk)))]
    if isinstance(runtime, GVisorRuntime):
        assert not runtime.runsc.has_state(sandbox_id), "runsc still has the container"
