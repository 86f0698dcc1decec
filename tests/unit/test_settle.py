"""settled: waiting for what the kernel finishes after a sandbox (a loop device, a process).

A fake clock stands in for time: the tests see the pauses asked for, not how the host slept.
"""

import pytest

from sandcell.runtime import settle
from sandcell.runtime.settle import settled


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(round(seconds, 6))
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(settle, "time", fake)
    return fake


def test_done_at_once_is_not_a_wait(clock: Clock) -> None:
    assert settled(lambda: True, timeout_s=5)
    assert clock.pauses == []


def test_looks_again_at_growing_intervals_until_done(clock: Clock) -> None:
    looks: list[float] = []

    def done() -> bool:
        looks.append(clock.now)
        return len(looks) == 8

    assert settled(done, timeout_s=5)
    assert clock.pauses == [0.005, 0.01, 0.02, 0.04, 0.05, 0.05, 0.05]


def test_gives_up_at_the_timeout_having_looked_a_few_times_not_every_few_ms(clock: Clock) -> None:
    looks: list[float] = []

    def never() -> bool:
        looks.append(clock.now)
        return False

    assert not settled(never, timeout_s=0.5)
    assert sum(clock.pauses) == pytest.approx(0.5)  # the last pause is cut to the deadline
    assert max(clock.pauses) == settle.MAX_LOOK_S
    assert len(looks) == len(clock.pauses) + 1 == 14  # every 10 ms it would have been 51
