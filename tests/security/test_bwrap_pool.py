"""Warm bwrap sandboxes: a job handed to one runs like a cold bwrap job, under the same
isolation, and nothing of it reaches the next. Every warm sandbox a test used (scratch, loop
device, cgroup, processes, its host uid) is gone when `run` returns."""

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import GUEST_CHANNEL_SOCKET, SandboxResult, SandboxSpec
from sandcell.runtime.bwrap import BwrapRuntime
from sandcell.runtime.images import FilesystemImageCatalog
from sandcell.runtime.pool import PoolConfig, WarmPool
from sandcell.runtime.pooled import PooledRuntime, warm_factory
from tests.integration.conftest import IMAGE_DIR, RecordingSink
from tests.pool_jobs import (
    LEAVE_BEHIND,
    LIKE_COLD,
    LIMIT_CASES,
    LOOK_FOR_LEFTOVERS,
    NOTHING_LEFT,
    like_cold_stdout,
    spec_for,
)
from tests.security.conftest import assert_released, processes_of_uid

pytestmark = pytest.mark.bwrap
WAIT_S = 30.0


@pytest.fixture
def pooled(bwrap: BwrapRuntime) -> Iterator[PooledRuntime]:
    images = FilesystemImageCatalog(IMAGE_DIR)
    pool = WarmPool(warm_factory(bwrap), images, PoolConfig({"python": 1}, Limits()))
    runtime = PooledRuntime(bwrap, pool)
    pool.start()
    yield runtime
    pool.close()  # destroys the warm ones, the one being booted too
    cgroups = Path("/sys/fs/cgroup/pids", bwrap.cgroup_parent)
    assert list(bwrap.sandboxes_dir.glob("pool-*")) == list(cgroups.glob("pool-*")) == []
    bwrap.uids.verify()
    assert bwrap.uids.free() == bwrap.uids.count  # every warm one's uid came back


def run_pooled(
    runtime: PooledRuntime, spec: SandboxSpec, expect_pooled: bool = True
) -> tuple[SandboxResult, RecordingSink]:
    """Run `spec` once a warm sandbox is ready; check that the one it used is released."""
    deadline = time.monotonic() + WAIT_S
    while runtime.pool.ready_count(spec.image.name) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    [warm_id] = runtime.pool.ready_ids(spec.image.name)
    [warm] = [w for w in runtime.pool._ready[spec.image.name] if w.sandbox_id == warm_id]
    sink = RecordingSink()
    result = runtime.run(spec, sink, threading.Event())
    assert result.pooled is expect_pooled, result
    assert result.released, result.detail
    if expect_pooled:
        assert_released(runtime.base, warm_id)
        assert warm.uid is not None and not processes_of_uid(warm.uid)
    return result, sink


def test_a_pooled_job_runs_like_a_cold_one(pooled: PooledRuntime, python_image: Image) -> None:
    result, sink = run_pooled(pooled, spec_for(python_image, LIKE_COLD))
    assert (result.reason, result.exit_code) == (Reason.EXIT_CODE, 3)
    assert sink.events[0] == ("ready", b"")
    assert sink.stdout == like_cold_stdout()
    assert sink.stderr == "to stderr\n"  # nothing of the runner's imports or its own frames
    assert pooled.name == "bwrap"  # what the job record will name
    # The heartbeat's report on the host is the base runtime's (its uid quarantine).
    assert pooled.health_figures() == pooled.base.health_figures() == {"quarantined_uids": 0}


def test_a_pooled_job_has_the_cold_jobs_isolation(
    pooled: PooledRuntime, python_image: Image
) -> None:
    code = (
        "import ctypes, os, socket\n"
        "status = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "print([status[k].strip() for k in ('Uid', 'CapEff', 'NoNewPrivs', 'Seccomp')])\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.syscall(425, 1, None), ctypes.get_errno())  # io_uring_setup\n"
        "print(socket.if_nameindex())\n"
    )
    result, sink = run_pooled(pooled, spec_for(python_image, code))
    assert result.reason is None, sink.stderr
    ids, io_uring, interfaces = sink.stdout.splitlines()
    assert ids == "['65534\\t65534\\t65534\\t65534', '0000000000000000', '1', '2']"
    assert io_uring.split()[0] == "-1"  # denied by the seccomp filter
    assert interfaces == "[(1, 'lo')]"  # its own network namespace, loopback only


def test_nothing_of_one_job_is_visible_to_the_next(
    pooled: PooledRuntime, python_image: Image
) -> None:
    _, sink1 = run_pooled(pooled, spec_for(python_image, LEAVE_BEHIND))
    assert sink1.stdout == "written\n" and "left-behind" in sink1.files
    _, sink2 = run_pooled(pooled, spec_for(python_image, LOOK_FOR_LEFTOVERS))
    assert sink2.stdout == NOTHING_LEFT, sink2.stderr
    assert sink2.files == {}


@pytest.mark.parametrize(("code", "limits", "reason"), LIMIT_CASES)
def test_limits_trip_with_the_right_reason_in_a_pooled_run(
    pooled: PooledRuntime, python_image: Image, code: str, limits: dict[str, float], reason: str
) -> None:
    started = time.monotonic()
    result, sink = run_pooled(pooled, spec_for(python_image, code, **limits))
    assert result.reason == Reason(reason), (result, sink.stderr)
    assert "survived" not in sink.stdout
    if reason == "timeout":  # counted from hand-over, not from the sandbox's boot
        assert sink.stdout == "sleeping\n" and time.monotonic() - started < 8


def test_a_job_the_pool_cannot_honour_starts_cold(
    pooled: PooledRuntime, python_image: Image
) -> None:
    result, sink = run_pooled(pooled, spec_for(python_image, "print('cold')", pids=64), False)
    assert result.reason is None and sink.stdout == "cold\n"
    assert pooled.pool.stats.refused == 1 and pooled.pool.stats.hits == 0


def test_a_hand_over_that_fails_still_releases_the_warm_sandbox(
    pooled: PooledRuntime, python_image: Image, tmp_path: Path
) -> None:
    """Its runner, waiting for a job that never comes, is ended with the sandbox."""
    elsewhere = tmp_path / "chan"  # not on the scratch's filesystem: the link fails
    elsewhere.mkdir()
    (elsewhere / GUEST_CHANNEL_SOCKET).touch()
    spec = replace(spec_for(python_image, "print(1)"), guest_channel=elsewhere)
    result, _ = run_pooled(pooled, spec)  # and released, its uid's processes gone
    assert result.reason is Reason.RUNTIME_ERROR, result
    assert "cannot start the sandbox" in (result.detail or "")
