"""Worker stop requests in the store, on SQLite and PostgreSQL (the two-backend fixture)."""

import time

import pytest

from sandcell.domain.errors import Conflict, NotFound
from sandcell.domain.records import WorkerInfo
from sandcell.domain.workers import StopMode
from sandcell.store.sql import SqlStore
from tests.contract.test_store import _job, _tenant, store  # noqa: F401  (the fixture)


def _seen(store: SqlStore, worker_id: str) -> None:  # noqa: F811
    store.worker_seen(WorkerInfo(worker_id, "h", "fake", "1", time.time()), time.time())


def test_a_stop_request_reaches_the_worker_and_only_escalates(store: SqlStore) -> None:  # noqa: F811
    _seen(store, "wrk_a")
    assert store.worker_stop_request("wrk_a") is None
    store.request_worker_stop("wrk_a", StopMode.DRAIN, time.time())
    store.request_worker_stop("wrk_a", StopMode.DRAIN, time.time())  # asked twice: no change
    assert store.worker_stop_request("wrk_a") is StopMode.DRAIN
    store.request_worker_stop("wrk_a", StopMode.STOP, time.time())
    assert store.worker_stop_request("wrk_a") is StopMode.STOP
    with pytest.raises(Conflict):
        store.request_worker_stop("wrk_a", StopMode.DRAIN, time.time())
    [listed] = store.list_workers(False, 10)
    assert (listed.id, listed.state(time.time())) == ("wrk_a", "stopping")


def test_unknown_and_stopped_workers_are_refused(store: SqlStore) -> None:  # noqa: F811
    with pytest.raises(NotFound):
        store.request_worker_stop("wrk_nope' OR 1=1 --", StopMode.STOP, time.time())
    _seen(store, "wrk_b")
    store.worker_stopped("wrk_b", time.time())
    with pytest.raises(Conflict):
        store.request_worker_stop("wrk_b", StopMode.DRAIN, time.time())
    assert store.list_workers(False, 10) == []
    [stopped] = store.list_workers(True, 10)
    assert stopped.state(time.time()) == "stopped"


def test_a_listed_worker_shows_the_jobs_it_holds(store: SqlStore) -> None:  # noqa: F811
    tenant = _tenant(store)
    _seen(store, "wrk_c")
    _seen(store, "wrk_d")
    job = _job(tenant)
    store.add_job(job, None)
    claimed = store.claim_next("wrk_c", time.time(), 30)
    assert claimed is not None and claimed.id == job.id
    held = {w.id: w.running_jobs for w in store.list_workers(False, 10)}
    assert held == {"wrk_c": [job.id], "wrk_d": []}
    assert [w.id for w in store.list_workers(False, 10, "wrk_d")] == ["wrk_d"]
