"""Warm pools against real runsc: one job per warm sandbox, nothing shared, limits intact.

Every pooled run is checked like a cold one: the warm sandbox it used (its scratch dir, loop
device, cgroup, runsc state and host processes) is gone when `run` returns.
"""

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from sandcell.app import guest_channels
from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import GUEST_CHANNEL_SOCKET, InputFile, SandboxResult, SandboxSpec
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.hand_over import SOURCE_IN_LINE_MAX
from sandcell.runtime.images import FilesystemImageCatalog
from sandcell.runtime.pool import PoolConfig, WarmPool
from sandcell.runtime.pooled import PooledRuntime, warm_factory
from tests.integration.conftest import IMAGE_DIR, RecordingSink, assert_released
from tests.pool_jobs import (
    LEAVE_BEHIND,
    LIKE_COLD,
    LIMIT_CASES,
    LOOK_FOR_LEFTOVERS,
    NOTHING_LEFT,
    like_cold_stdout,
    spec_for,
)

pytestmark = pytest.mark.gvisor
PROFILE = Limits()
WAIT_S = 60.0
SEEDED_HASH_OF_A = 4644417185603328019  # hash('a') under PYTHONHASHSEED=0, 64-bit CPython 3.11


def wait_for(condition: object, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.05)
    return False


def make_pool(runtime: GVisorRuntime, **config: object) -> PooledRuntime:
    settings = {"sizes": {"python": 1}, "profile": PROFILE} | config
    images = FilesystemImageCatalog(IMAGE_DIR)
    pool = WarmPool(warm_factory(runtime), images, PoolConfig(**settings))  # type: ignore[arg-type]
    pooled = PooledRuntime(runtime, pool)
    pool.start()
    return pooled


@pytest.fixture
def pooled(gvisor: GVisorRuntime, python_image: Image) -> Iterator[PooledRuntime]:
    runtime = make_pool(gvisor)
    yield runtime
    ids = runtime.pool.ready_ids("python")
    runtime.close()
    for sandbox_id in ids:
        assert_released(gvisor, sandbox_id)


@dataclass
class EarlyRecordingSink(RecordingSink):
    """Also takes the result early (ports.runtime.EarlySink), noting what it had by then."""

    early: list[tuple[SandboxResult, dict[str, bytes], str, bool]] = field(default_factory=list)
    warm_id: str = ""
    runtime: GVisorRuntime | None = None

    def ended(self, result: SandboxResult) -> None:
        assert self.runtime is not None
        unreleased = (self.runtime.sandboxes_dir / self.warm_id).exists()
        self.early.append((replace(result), dict(self.files), self.stdout, unreleased))


def run_pooled(
    runtime: PooledRuntime,
    spec: SandboxSpec,
    expect_pooled: bool = True,
    sink: RecordingSink | None = None,
) -> tuple[SandboxResult, RecordingSink]:
    """Run `spec` once a warm sandbox is ready; check that the one it used is released."""
    name = spec.image.name
    assert wait_for(lambda: runtime.pool.ready_count(name) >= 1), "the pool never filled"
    [warm_id, *_] = runtime.pool.ready_ids(name)
    sink = sink or RecordingSink()
    if isinstance(sink, EarlyRecordingSink):
        sink.warm_id, sink.runtime = warm_id, runtime.base
    result = runtime.run(spec, sink, threading.Event())
    assert result.pooled is expect_pooled, result
    assert result.released, result.detail
    if expect_pooled:
        assert_released(runtime.base, warm_id)
    assert_released(runtime.base, spec.sandbox_id)  # the job's own id was never used
    return result, sink


def test_a_pooled_job_runs_like_a_cold_one(pooled: PooledRuntime, python_image: Image) -> None:
    result, sink = run_pooled(pooled, spec_for(python_image, LIKE_COLD))
    assert (result.reason, result.exit_code) == (Reason.EXIT_CODE, 3)  # type: ignore[attr-defined]
    assert sink.events[0] == ("ready", b"")
    assert sink.stdout == like_cold_stdout()
    assert sink.stderr == "to stderr\n"  # nothing of the runner's imports or its own frames


def test_a_cold_job_prints_what_a_pooled_one_must(
    gvisor: GVisorRuntime, python_image: Image
) -> None:
    sink = RecordingSink()
    result = gvisor.run(spec_for(python_image, LIKE_COLD), sink, threading.Event())
    assert (result.reason, result.exit_code) == (Reason.EXIT_CODE, 3)  # type: ignore[attr-defined]
    assert not result.pooled
    assert (sink.stdout, sink.stderr) == (like_cold_stdout(), "to stderr\n")


def test_an_uncaught_exception_shows_only_the_jobs_frames(
    pooled: PooledRuntime, python_image: Image
) -> None:
    result, sink = run_pooled(pooled, spec_for(python_image, "def f():\n    1/0\nf()\n"))
    assert (result.reason, result.exit_code) == (Reason.EXIT_CODE, 1)  # type: ignore[attr-defined]
    assert sink.stderr.startswith('Traceback (most recent call last):\n  File "/job/main.py"')
    assert "pool_runner" not in sink.stderr and "ZeroDivisionError" in sink.stderr
    assert "    1/0" in sink.stderr  # the source line: the code is at /job/main.py


@pytest.mark.parametrize("padding", [0, SOURCE_IN_LINE_MAX], ids=["in-line", "from-the-file"])
def test_the_job_runs_its_exact_source(
    pooled: PooledRuntime, python_image: Image, padding: int
) -> None:
    """A small source comes in the hand-over line, a large one from /job/main.py: either way
    the same bytes as the file, so a declared encoding and a non-UTF-8 byte survive."""
    code = (
        b"# -*- coding: latin-1 -*-\n"
        + b"#" * padding
        + b"\nprint(ascii('\xe9'))\n"  # latin-1's e-acute: mangled bytes would print others
    )
    spec = replace(spec_for(python_image, ""), code=code)
    result, sink = run_pooled(pooled, spec)
    assert result.exit_code == 0, sink.stderr  # type: ignore[attr-defined]
    assert sink.stdout == "'\\xe9'\n"


def test_nothing_of_one_job_is_visible_to_the_next(
    pooled: PooledRuntime, python_image: Image
) -> None:
    _, sink1 = run_pooled(pooled, spec_for(python_image, LEAVE_BEHIND))
    assert sink1.stdout == "written\n" and "left-behind" in sink1.files
    _, sink2 = run_pooled(pooled, spec_for(python_image, LOOK_FOR_LEFTOVERS))
    assert sink2.stdout == NOTHING_LEFT, sink2.stderr
    assert sink2.files == {}


def test_inputs_and_the_guest_channel_arrive_at_hand_over(
    pooled: PooledRuntime, python_image: Image, tmp_path: Path
) -> None:
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")
    channels = guest_channels(tmp_path)  # where the worker makes a job's channel, as there
    channel = channels.root / "chan"
    channel.mkdir(mode=0o711)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(channel / GUEST_CHANNEL_SOCKET))
    os.chmod(channel / GUEST_CHANNEL_SOCKET, 0o666)
    server.listen(1)
    heard: list[bytes] = []

    def listen() -> None:
        conn, _ = server.accept()
        with conn:
            heard.append(conn.recv(100))

    listener = threading.Thread(target=listen)
    listener.start()
    code = (
        "import socket\n"
        "print(open('/input/sub/data.csv').read().splitlines())\n"
        "try:\n    open('/input/new', 'w')\n"
        "except OSError as exc:\n    print('ro', exc.errno in (13, 30))\n"
        "s = socket.socket(socket.AF_UNIX); s.connect('/run/sandcell/guest/guest.sock')\n"
        "s.sendall(b'hello host')\n"
    )
    spec = replace(
        spec_for(python_image, code),
        inputs=[InputFile(data, "sub/data.csv")],
        guest_channel=channel,
    )
    result, sink = run_pooled(pooled, spec)
    listener.join(10)
    server.close()
    shutil.rmtree(channels.root)
    assert result.reason is None, sink.stderr  # type: ignore[attr-defined]
    assert sink.stdout == "['a,b', '1,2']\nro True\n"  # /input stays read-only
    assert heard == [b"hello host"]


def test_a_hand_over_that_fails_still_releases_the_warm_sandbox(
    pooled: PooledRuntime, python_image: Image, tmp_path: Path
) -> None:
    """Its runner, waiting for a job that never comes, is ended with the sandbox."""
    assert wait_for(lambda: pooled.pool.ready_count("python") >= 1), "the pool never filled"
    [warm_id, *_] = pooled.pool.ready_ids("python")
    elsewhere = tmp_path / "chan"  # not on the scratch's filesystem: the link fails
    elsewhere.mkdir()
    (elsewhere / GUEST_CHANNEL_SOCKET).touch()
    spec = replace(spec_for(python_image, "print(1)"), guest_channel=elsewhere)
    began = time.monotonic()
    result = pooled.run(spec, RecordingSink(), threading.Event())
    assert result.pooled and result.reason is Reason.RUNTIME_ERROR, result
    assert "cannot start the sandbox" in (result.detail or "")
    assert result.released, result.detail
    assert time.monotonic() - began < 5  # ended, not waited out
    assert_released(pooled.base, warm_id)


def test_what_python_writes_at_its_exit_reaches_the_outputs(
    pooled: PooledRuntime, python_image: Image
) -> None:
    """A file left open in a global is flushed, and `__del__` runs, as at python's own exit."""
    code = (
        "import sys\n"
        "kept = open('/output/global.txt', 'w'); kept.write('global')\n"
        "class Holder: pass\n"
        "class Loud:\n"
        "    def __del__(self): print('bye', file=sys.stderr)\n"
        "loud = Loud()\n"
    )
    result, sink = run_pooled(pooled, spec_for(python_image, code))
    assert result.reason is None, sink.stderr  # type: ignore[attr-defined]
    assert sink.files == {"global.txt": b"global"}
    assert sink.stderr == "bye\n"


@pytest.mark.parametrize(("code", "exit_code"), [("", 0), ("raise SystemExit(3)", 3)])
def test_the_result_comes_before_the_sandbox_is_torn_down(
    pooled: PooledRuntime, python_image: Image, code: str, exit_code: int
) -> None:
    code = "import mmap, sys\nprint('out')\nprint('err', file=sys.stderr)\n" + (
        "f = open('/output/left-open.txt', 'w'); f.write('kept')\n"
        "m = open('/output/mapped.bin', 'w+b'); m.truncate(6)\n"
        "mapped = mmap.mmap(m.fileno(), 6); mapped[:] = b'mapped'\n" + code
    )
    sink = EarlyRecordingSink()
    result, _ = run_pooled(pooled, spec_for(python_image, code), sink=sink)
    [(early, files, stdout, unreleased)] = sink.early
    assert unreleased  # reported before the release began
    assert (early.exit_code, early.released, early.pooled) == (exit_code, False, True)
    assert early.reason is (Reason.EXIT_CODE if exit_code else None)
    # gVisor writes /output's files through to the host (shared mounts), mapped ones too.
    assert files == {"left-open.txt": b"kept", "mapped.bin": b"mapped"} and stdout == "out\n"
    assert (result.exit_code, result.reason, result.usage) == (
        early.exit_code,
        early.reason,
        early.usage,
    )
    assert result.released and sink.stderr == "err\n"  # no exit line of the runner's


def test_a_child_the_job_forks_does_not_end_the_job(
    pooled: PooledRuntime, python_image: Image
) -> None:
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n    sys.exit(0)\n"
        "os.wait(); time.sleep(0.5); print('parent done')\n"
        "raise SystemExit(4)\n"
    )
    sink = EarlyRecordingSink()
    result, _ = run_pooled(pooled, spec_for(python_image, code), sink=sink)
    assert (result.reason, result.exit_code) == (Reason.EXIT_CODE, 4), sink.stderr
    assert sink.stdout == "parent done\n"


def test_a_job_that_prints_the_exit_line_only_ends_itself_early(
    pooled: PooledRuntime, python_image: Image
) -> None:
    """What follows the line is not delivered, and the sandbox is stopped, not waited for."""
    code = (
        "import sys, time\n"
        "for out in (sys.stdout, sys.stderr):\n"
        "    print('before\\x1esandcell-exit 0', file=out, flush=True)\n"
        "print('after', flush=True); time.sleep(60)\n"
    )
    sink = EarlyRecordingSink()
    started = time.monotonic()
    result, _ = run_pooled(pooled, spec_for(python_image, code, timeout_s=120), sink=sink)
    assert time.monotonic() - started < 20  # killed EXIT_WAIT_S after its stdin closed
    assert result.reason is None and result.released
    assert (sink.stdout, sink.stderr) == ("before", "before")
    assert len(sink.early) == 1


@pytest.mark.parametrize(("code", "limits", "reason"), LIMIT_CASES)
def test_limits_trip_with_the_right_reason_in_a_pooled_run(
    pooled: PooledRuntime,
    python_image: Image,
    code: str,
    limits: dict[str, float],
    reason: str,
) -> None:
    started = time.monotonic()
    sink = EarlyRecordingSink()
    result, _ = run_pooled(pooled, spec_for(python_image, code, **limits), sink=sink)
    assert result.reason == Reason(reason), (result, sink.stderr)
    assert sink.early == []  # a limit's end is reported once the release is verified
    assert "survived" not in sink.stdout
    if reason == "timeout":  # counted from hand-over, not from the sandbox's boot
        assert sink.stdout == "sleeping\n" and time.monotonic() - started < 8


@pytest.mark.parametrize("limits", [{"pids": 64}, {"disk_mb": 64}, {"memory_mb": 1024}])
def test_jobs_with_limits_the_pool_cannot_honour_start_cold(
    pooled: PooledRuntime, python_image: Image, limits: dict[str, float]
) -> None:
    spec = spec_for(python_image, "print('cold')", **limits)
    result, sink = run_pooled(pooled, spec, expect_pooled=False)
    assert result.reason is None and sink.stdout == "cold\n"  # type: ignore[attr-defined]
    assert pooled.pool.stats.refused == 1 and pooled.pool.stats.hits == 0


def test_a_job_that_sets_what_python_reads_at_start_starts_cold(
    pooled: PooledRuntime, python_image: Image
) -> None:
    code = "import sys; print(hash('a'), sys.flags.hash_randomization)"
    spec = spec_for(python_image, code)
    spec = replace(spec, env=spec.env | {"PYTHONHASHSEED": "0"})
    result, sink = run_pooled(pooled, spec, expect_pooled=False)
    assert result.reason is None, sink.stderr  # type: ignore[attr-defined]
    assert sink.stdout == f"{SEEDED_HASH_OF_A} 0\n"  # python's own for seed 0
    assert pooled.pool.stats.refused == 1 and pooled.pool.stats.hits == 0


def test_the_pool_refills_after_a_job(pooled: PooledRuntime, python_image: Image) -> None:
    assert wait_for(lambda: pooled.pool.ready_count("python") == 1)
    [first] = pooled.pool.ready_ids("python")
    run_pooled(pooled, spec_for(python_image, "print(1)"))
    assert wait_for(lambda: pooled.pool.ready_count("python") == 1)
    assert pooled.pool.ready_ids("python") != [first]
    assert pooled.pool.stats.booted == 2 and pooled.pool.stats.hits == 1


def test_an_idle_pool_shrinks_and_releases_its_sandboxes(
    gvisor: GVisorRuntime, python_image: Image
) -> None:
    runtime = make_pool(gvisor, idle_s=2.0, tick_s=0.1)
    try:
        assert wait_for(lambda: runtime.pool.ready_count("python") == 1)
        ids = runtime.pool.ready_ids("python")
        assert wait_for(lambda: runtime.pool.stats.shrunk == 1, 10)
        assert runtime.pool.ready_count("python") == 0
        for sandbox_id in ids:
            assert_released(gvisor, sandbox_id)
        time.sleep(0.5)
        assert runtime.pool.ready_count("python") == 0  # no refill while idle
        run_pooled_cold(runtime, spec_for(python_image, "print(1)"))
        assert wait_for(lambda: runtime.pool.ready_count("python") == 1)  # a job: fill again
    finally:
        runtime.close()


def test_a_fork_bomb_in_a_pooled_run_ends_pids(gvisor: GVisorRuntime, python_image: Image) -> None:
    """It dies on its first EAGAIN. The pool's process budget is 32, as in the cold runtime's
    tests: at the default 128 its pythons (3-4.5 MB each in gVisor's memory) reach the default
    512 MB about as soon, and which limit trips first is then a race (CI saw both)."""
    pooled = make_pool(gvisor, profile=Limits(pids=32))
    try:
        sink = EarlyRecordingSink()
        spec = spec_for(python_image, "import os\nwhile True: os.fork()", pids=32)
        result, _ = run_pooled(pooled, spec, sink=sink)
        assert result.reason is Reason.PIDS, (result, sink.stderr)
        assert result.released and sink.early == []
    finally:
        ids = pooled.pool.ready_ids("python")
        pooled.close()
        for sandbox_id in ids:
            assert_released(gvisor, sandbox_id)


def run_pooled_cold(runtime: PooledRuntime, spec: SandboxSpec) -> tuple[object, RecordingSink]:
    sink = RecordingSink()
    result = runtime.run(spec, sink, threading.Event())
    assert not result.pooled and result.released and result.reason is None, result
    return result, sink


def test_the_memory_bound_stops_refills(gvisor: GVisorRuntime, python_image: Image) -> None:
    runtime = make_pool(gvisor, sizes={"python": 3}, memory_mb=8, tick_s=0.1)
    try:
        assert wait_for(lambda: runtime.pool.stats.memory_blocked >= 3, 10)
        assert runtime.pool.ready_count("python") == 0 and runtime.pool.stats.booted == 0
        run_pooled_cold(runtime, spec_for(python_image, "print(1)"))  # no pool: cold
    finally:
        runtime.close()


def test_the_memory_bound_counts_measured_sandboxes(
    gvisor: GVisorRuntime, python_image: Image
) -> None:
    # Room for the first guess (64 MB), then for what was measured: a few, not all ten.
    runtime = make_pool(gvisor, sizes={"python": 10}, memory_mb=80, tick_s=0.1)
    try:
        assert wait_for(lambda: runtime.pool.stats.memory_blocked >= 1)
        count = runtime.pool.ready_count("python")
        assert 1 <= count < 10
        assert runtime.pool.memory_bytes() <= 80 * 2**20
    finally:
        runtime.close()


def test_csv_to_chart_in_a_python_data_pool(
    gvisor: GVisorRuntime, python_data_image: Image, tmp_path: Path
) -> None:
    runtime = make_pool(gvisor, sizes={"python-data": 1})
    data = tmp_path / "data.csv"
    data.write_text("x,y\n" + "".join(f"{i},{i * i % 97}\n" for i in range(10_000)))
    code = (
        "import sys, pandas as pd, matplotlib.pyplot as plt\n"
        "print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules))\n"
        "df = pd.read_csv('/input/data.csv')\n"
        "figure = df.plot(x='x', y='y', title='squares mod 97').figure\n"
        "figure.savefig('/output/chart.png', metadata={'Software': None})\n"
        "figure.savefig('/output/chart.pdf', metadata={'CreationDate': None})\n"
        "print(len(df))\n"
    )
    try:
        spec = replace(spec_for(python_data_image, code), inputs=[InputFile(data, "data.csv")])
        result, sink = run_pooled(runtime, spec)
        assert result.reason is None, sink.stderr
        assert sink.stdout == "['matplotlib', 'pandas']\n10000\n"
        # The pool's fonts are read from memory (guest/memory_fonts.py): the same chart as a
        # cold sandbox draws from the font files, and the PDF backend still finds their paths.
        cold_spec = replace(spec, limits=Limits(pids=64))  # a limit the pool refuses: cold
        cold, cold_sink = run_pooled(runtime, cold_spec, expect_pooled=False)
        assert cold.reason is None, cold_sink.stderr
        assert sink.files["chart.png"].startswith(b"\x89PNG")
        assert sink.files["chart.png"] == cold_sink.files["chart.png"]
        assert sink.files["chart.pdf"] == cold_sink.files["chart.pdf"]
    finally:
        runtime.close()
