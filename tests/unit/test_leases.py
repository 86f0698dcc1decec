"""One keeper for every running job's lease: one read a look for all of them, a cancel relayed
to its own job only, a lost lease stops its job, and nothing is done for a released job."""

import threading
import time

from sandcell.domain.errors import StoreUnavailable
from sandcell.domain.limits import Limits
from sandcell.domain.records import Job, JobSpec
from sandcell.domain.states import JobState
from sandcell.ports.notify import JOB_CANCEL, LocalNotifier
from sandcell.services.leases import LeaseKeeper

LEASE_S, EVERY_S = 2.0, 0.05


class Store:
    """The two reads and writes the keeper makes, kept in memory and counted."""

    def __init__(self) -> None:
        self.cancelled: set[str] = set()
        self.lost: set[str] = set()
        self.looks: list[list[str]] = []
        self.renewed: list[str] = []
        self.down = False

    def cancels_requested(self, job_ids: list[str]) -> set[str]:
        if self.down:
            raise StoreUnavailable()
        self.looks.append(sorted(job_ids))
        return self.cancelled & set(job_ids)

    def renew_lease(self, job_id: str, token: int, now: float, lease_s: float) -> bool:
        self.renewed.append(job_id)
        return job_id not in self.lost


def _job(job_id: str, lease_left_s: float = LEASE_S) -> Job:
    spec = JobSpec("python", "print(1)", None, [], Limits(), {})
    job = Job(job_id, "alice", JobState.RUNNING, spec, time.time(), None)
    job.lease_expires_at = time.time() + lease_left_s
    return job


def _events() -> tuple[threading.Event, threading.Event]:
    return threading.Event(), threading.Event()


def _keeper(store: Store, notifier: LocalNotifier | None = None) -> LeaseKeeper:
    return LeaseKeeper(store, notifier or LocalNotifier(), LEASE_S, EVERY_S)  # type: ignore[arg-type]


def _until(check: object, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _keeper_threads() -> int:
    return sum(thread.name == "leases" for thread in threading.enumerate())


def test_one_read_looks_at_every_held_job_and_a_cancel_stops_only_its_own() -> None:
    store = Store()
    keeper = _keeper(store)
    (a_done, a_lost), (b_done, b_lost) = _events(), _events()
    release_a = keeper.hold(_job("job_a"), 1, a_done, a_lost)
    release_b = keeper.hold(_job("job_b"), 1, b_done, b_lost)
    _until(lambda: ["job_a", "job_b"] in store.looks)
    store.cancelled.add("job_b")
    _until(b_done.is_set)
    assert not a_done.is_set() and not a_lost.is_set() and not b_lost.is_set()
    assert store.renewed == []  # a fresh lease is renewed only at half-life
    release_a(), release_b()
    _until(lambda: _keeper_threads() == 0)  # no job held: no thread left


def test_a_cancel_notification_makes_it_look_at_once() -> None:
    store, notifier = Store(), LocalNotifier()
    keeper = LeaseKeeper(store, notifier, LEASE_S, 3600)  # type: ignore[arg-type]
    done, lost = _events()
    release = keeper.hold(_job("job_a"), 1, done, lost)
    store.cancelled.add("job_a")
    time.sleep(0.1)
    assert not done.is_set()  # its next look is an hour away
    notifier.notify(JOB_CANCEL, "job_a")
    assert done.wait(5)
    release()
    notifier.notify(JOB_CANCEL, "job_a")  # wakes the keeper, which finds nothing held
    _until(lambda: _keeper_threads() == 0)


def test_a_lease_is_renewed_at_half_life_and_a_lost_one_stops_its_job() -> None:
    store = Store()
    keeper = _keeper(store)
    (a_done, a_lost), (b_done, b_lost) = _events(), _events()
    job_a = _job("job_a", lease_left_s=LEASE_S / 4)
    release_a = keeper.hold(job_a, 1, a_done, a_lost)
    store.lost.add("job_b")
    release_b = keeper.hold(_job("job_b", lease_left_s=LEASE_S / 4), 1, b_done, b_lost)
    _until(lambda: b_lost.is_set() and b_done.is_set())
    _until(lambda: "job_a" in store.renewed)
    assert job_a.lease_expires_at is not None and job_a.lease_expires_at > time.time() + LEASE_S / 2
    assert not a_done.is_set() and not a_lost.is_set()
    release_a(), release_b()


def test_in_a_store_outage_a_job_is_stopped_only_once_its_lease_has_run_out() -> None:
    store = Store()
    store.down = True
    keeper = _keeper(store)
    (a_done, a_lost), (b_done, b_lost) = _events(), _events()
    release_a = keeper.hold(_job("job_a", lease_left_s=0.3), 1, a_done, a_lost)
    release_b = keeper.hold(_job("job_b", lease_left_s=60), 1, b_done, b_lost)
    _until(lambda: a_lost.is_set() and a_done.is_set())
    assert not b_lost.is_set() and not b_done.is_set()  # its lease has slack
    release_a(), release_b()


def test_nothing_is_done_for_a_job_once_it_is_released() -> None:
    store = Store()
    keeper = _keeper(store)
    done, lost = _events()
    release = keeper.hold(_job("job_a", lease_left_s=LEASE_S / 4), 1, done, lost)
    release()
    store.cancelled.add("job_a")
    store.lost.add("job_a")
    time.sleep(EVERY_S * 4)
    assert not done.is_set() and not lost.is_set()
    assert store.renewed == [] and all("job_a" not in look for look in store.looks)
