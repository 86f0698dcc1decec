"""While a program starts, the sandbox watch waits for its ready line, not for a tick."""

import os
import threading
import time
from collections.abc import Iterator

import pytest

from sandcell.domain.limits import Limits
from sandcell.domain.states import Reason
from sandcell.ports.runtime import SandboxResult
from sandcell.runtime.bundle import READY_MARKER
from sandcell.runtime.one_shot import BOOT_LOOK_S, OneShotRun
from sandcell.runtime.streams import Streams

LONG_TICK_S = 10.0  # so long that a wait which ends early was ended by the stream


class Sink:
    def ready(self) -> None: ...

    def output(self, stream: str, data: bytes) -> None: ...

    def output_file(self, *_: object) -> None: ...


class Run(OneShotRun):
    """Only the watch's waiting, with a tick long enough to tell the two ends of a wait apart."""

    def __init__(self) -> None:
        self.limits = Limits(timeout_s=60)

    def _wait_s(self, streams: Streams) -> float:
        return LONG_TICK_S

    def _prepare(self) -> None: ...

    def _launch(self) -> Streams:
        raise NotImplementedError

    def _limit_crossed(self, streams: Streams) -> Reason | None:
        return None

    def _kill(self) -> None: ...

    def _decide(self, streams: Streams, exit_code: int) -> SandboxResult:
        raise NotImplementedError

    def _force_kill(self) -> None: ...

    def _release(self) -> list[str]:
        return []


@pytest.fixture
def started() -> Iterator[tuple[Streams, int]]:
    """Running streams over fresh pipes, and the write end of the program's stdout."""
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    streams = Streams(os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"), Sink(), 1 << 20)
    streams.start()
    yield streams, out_w
    for fd in (out_w, err_w):
        os.close(fd)
    assert streams.join(5)


def _write_soon(fd: int, data: bytes) -> None:
    threading.Timer(0.05, os.write, (fd, data)).start()


def test_the_ready_line_ends_the_wait_at_once(started: tuple[Streams, int]) -> None:
    streams, out_w = started
    _write_soon(out_w, READY_MARKER)
    began = time.monotonic()
    assert Run()._waited_for_start(streams)
    assert time.monotonic() - began < LONG_TICK_S / 4  # not the tick: the line ended it
    assert streams.ready_at is not None
    assert not Run()._waited_for_start(streams)  # decided: the exit is what to wait for now


def test_a_program_that_never_starts_ends_the_wait_too(started: tuple[Streams, int]) -> None:
    streams, out_w = started
    _write_soon(out_w, b"runsc: cannot start\n")  # not the ready line: it never started
    began = time.monotonic()
    assert Run()._waited_for_start(streams)
    assert time.monotonic() - began < LONG_TICK_S / 4
    assert streams.ready_at is None and not Run()._waited_for_start(streams)


class CountingCgroup:
    """A cgroup whose counters say `oom_kill` once `oom` is set; it counts its reads."""

    def __init__(self) -> None:
        self.reads, self.oom = 0, False

    def oom_kills(self) -> int:
        self.reads += 1
        return int(self.oom)

    def pids_limit_hits(self) -> int:
        self.reads += 1
        return 0


def test_while_booting_the_cgroup_is_read_once_a_look_then_every_tick(
    started: tuple[Streams, int],
) -> None:
    streams, out_w = started
    run, cgroup = Run(), CountingCgroup()
    run.cgroup = cgroup  # type: ignore[assignment]
    now = 100.0
    assert run._cgroup_limit(streams, now) is None and cgroup.reads == 2  # the first look
    for step in range(1, 10):  # the rest of a BOOT_LOOK_S of ticks: no reads
        assert run._cgroup_limit(streams, now + step * BOOT_LOOK_S / 10) is None
    assert cgroup.reads == 2
    cgroup.oom = True
    assert run._cgroup_limit(streams, now + BOOT_LOOK_S) is Reason.MEMORY  # the next look
    cgroup.oom, cgroup.reads = False, 0
    os.write(out_w, READY_MARKER)
    assert streams.decided.wait(5) and streams.ready_at is not None
    for step in range(3):  # the program runs: every tick reads both counters
        assert run._cgroup_limit(streams, now + BOOT_LOOK_S + step * 0.01) is None
    assert cgroup.reads == 6
