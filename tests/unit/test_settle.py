"""settled: waiting for what the kernel finishes after a sandbox (a loop device, a process)."""

import itertools
import time

from sandcell.runtime.settle import MAX_LOOK_S, settled


def test_done_at_once_is_not_a_wait() -> None:
    started = time.monotonic()
    assert settled(lambda: True, timeout_s=5)
    assert time.monotonic() - started < 0.05


def test_looks_again_at_growing_intervals_until_done() -> None:
    looks: list[float] = []

    def done() -> bool:
        looks.append(time.monotonic())
        return len(looks) == 7

    assert settled(done, timeout_s=5)
    gaps = [b - a for a, b in itertools.pairwise(looks)]
    assert gaps[-1] > gaps[0] * 3  # 5 ms, then 10, 20, 40, 50, 50
    assert max(gaps) < MAX_LOOK_S + 0.05


def test_gives_up_at_the_timeout_having_looked_a_few_times_not_every_few_ms() -> None:
    looks: list[float] = []

    def never() -> bool:
        looks.append(time.monotonic())
        return False

    started = time.monotonic()
    assert not settled(never, timeout_s=0.5)
    waited = time.monotonic() - started
    assert 0.5 <= waited < 0.7
    assert 5 <= len(looks) <= 16  # every 10 ms it would have been ~50
