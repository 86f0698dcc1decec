"""UidPool's bookkeeping, with the /proc scan stubbed (tests/security has the real one)."""

import pytest

from sandcell.domain.errors import RuntimeUnavailable
from sandcell.runtime.bwrap import UidPool


class Scan:
    """A stand-in for processes_by_uid: `running` uid -> pids, and how often it was asked."""

    def __init__(self) -> None:
        self.running: dict[int, list[int]] = {}
        self.calls = 0

    def __call__(self, first: int, count: int) -> dict[int, list[int]]:
        self.calls += 1
        return {uid: pids for uid, pids in self.running.items() if first <= uid < first + count}


def test_a_released_uid_is_free_again_only_after_a_scan() -> None:
    scan = Scan()
    pool = UidPool(100, 3, batch=64, scan=scan)
    taken = [pool.take() for _ in range(3)]
    pool.give_back(taken[0])
    assert pool.free() == 0
    pool.verify()
    assert pool.free() == 1 and pool.take() == taken[0]


def test_one_scan_serves_a_batch_of_releases() -> None:
    scan = Scan()
    pool = UidPool(100, 1000, batch=4, scan=scan)
    for _ in range(40):
        pool.give_back(pool.take())
    # The first take scans (what an earlier worker left), then one scan per 4 releases.
    assert scan.calls == 1 + 36 // 4
    assert pool.free() + 4 == 1000  # the last batch waits for its scan


def test_a_uid_still_in_use_after_its_release_is_never_handed_out_again() -> None:
    scan = Scan()
    pool = UidPool(100, 2, scan=scan)
    first, second = pool.take(), pool.take()
    scan.running[first] = [4242]  # an escaped process
    pool.give_back(first)
    pool.give_back(second)
    pool.verify()
    assert pool.quarantined == {first}
    del scan.running[first]  # gone since: the uid stays out all the same
    pool.verify()
    assert pool.take() == second
    with pytest.raises(RuntimeUnavailable, match="no free sandbox uid"):
        pool.take()


def test_the_uids_of_running_sandboxes_are_not_suspects() -> None:
    scan = Scan()
    pool = UidPool(100, 3, scan=scan)
    running, released = pool.take(), pool.take()
    scan.running[running] = [4242]  # its sandbox is still running
    pool.give_back(released)
    pool.verify()
    assert pool.quarantined == set() and pool.free() == 2
    del scan.running[running]
    pool.give_back(running)
    pool.verify()
    assert pool.quarantined == set() and pool.free() == 3


def test_a_uid_left_running_by_an_earlier_worker_is_never_handed_out() -> None:
    scan = Scan()
    scan.running[100] = [77]
    pool = UidPool(100, 3, scan=scan)
    assert pool.take() == 101
    assert pool.quarantined == {100} and pool.free() == 1


def test_an_empty_pool_scans_before_it_gives_up() -> None:
    scan = Scan()
    pool = UidPool(100, 1, batch=64, scan=scan)
    pool.give_back(pool.take())
    assert pool.take() == 100  # the release was verified on demand, not left waiting for a batch
