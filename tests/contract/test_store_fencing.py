"""Fencing on both backends: every write a worker makes is refused once its token is stale,
also when the token changes while the write is under way (a settler or re-claimer racing it).

The races are made deterministic by pausing one side inside its open transaction (an engine
event after a chosen statement) until the other side is seen blocked on it, or has finished.
"""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import IntegrityError

from sandcell.domain.errors import Conflict, StaleLease
from sandcell.domain.ids import new_id
from sandcell.domain.limits import Limits
from sandcell.domain.records import Artifact, Job, JobSpec
from sandcell.domain.states import JobState, Reason
from sandcell.store.sql import SqlStore
from tests.contract.test_store import _tenant, store  # noqa: F401  (the fixture)

SQLITE_BLOCKED_S = 0.5  # a waiter on SQLite's write lock cannot be observed: give it this long


def _artifact(job: Job, path: str = "clean.csv") -> Artifact:
    return Artifact(new_id("art"), job.tenant_id, job.id, path, 1, "0" * 64, time.time())


def _renew(s: SqlStore, job: Job, token: int) -> None:
    if not s.renew_lease(job.id, token, time.time(), 30):
        raise StaleLease()


def _finish(s: SqlStore, job: Job, token: int) -> None:
    ended = replace(job, state=JobState.COMPLETED, finished_at=time.time())
    s.finish_job(ended, token, [("stdout", b"last")], [_artifact(job)])


Write = Callable[[SqlStore, Job, int], object]
FENCED: dict[str, Write] = {
    "append_log": lambda s, job, token: s.append_log(job.id, token, "stdout", b"late"),
    "add_artifacts": lambda s, job, token: s.add_artifacts(job.id, [_artifact(job)], token),
    "commit_stage": lambda s, job, token: s.commit_stage(
        job.id, token, "clean", [_artifact(job)], time.time()
    ),
    "record_once": lambda s, job, token: s.record_once(job.id, token, "notify", time.time()),
    "mark_started": lambda s, job, token: s.mark_started(job.id, token, time.time(), "d", "sbx"),
    "renew_lease": _renew,
    "release_job": lambda s, job, token: s.release_job(job.id, token, time.time()),
    "finish_job": _finish,
    "fail_job": lambda s, job, token: s.fail_job(job.id, Reason.INTERNAL, "x", time.time(), token),
}
CHECK_THEN_WRITE = ["append_log", "add_artifacts", "commit_stage", "record_once", "release_job"]


def _claimed(store: SqlStore, lease_s: float = 30) -> Job:  # noqa: F811
    """A running job that may run twice (so a re-claim gives it a newer token)."""
    tenant = _tenant(store)
    spec = JobSpec("python", "print(1)", None, [], Limits(), {}, retry={"max_attempts": 2})
    store.add_job(Job(new_id("job"), tenant.id, JobState.ACCEPTED, spec, time.time(), None), None)
    job = store.claim_next("w1", time.time(), lease_s)
    assert job is not None
    return job


def _written(store: SqlStore, job_id: str) -> tuple[Any, ...]:  # noqa: F811
    """Everything a fenced write could have changed about the job."""
    found = store.get_job(None, job_id)
    assert found is not None
    return (
        [(c.stream, c.data) for c in store.read_logs(job_id, -1)],
        [a.path for a in store.list_artifacts(job_id)],
        store.job_stages(job_id),
        store.once_keys(job_id),
        (found.state, found.fencing_token, found.started_at, found.sandbox_id, found.attempts),
    )


def _settle(store: SqlStore, reclaim: bool) -> list[str]:  # noqa: F811
    """Another worker's housekeeping finds the lease expired; maybe it also re-claims the job."""
    lost = store.fail_lost_jobs(time.time() + 3600)
    if reclaim:
        assert store.claim_next("w2", time.time(), 30) is not None
    return lost


@pytest.mark.parametrize("op", list(FENCED))
@pytest.mark.parametrize("reclaim", [False, True], ids=["lost", "reclaimed"])
def test_a_stale_token_is_refused_and_writes_nothing(
    store: SqlStore,  # noqa: F811
    op: str,
    reclaim: bool,
) -> None:
    job = _claimed(store)
    assert _settle(store, reclaim) == [job.id]
    before = _written(store, job.id)
    with pytest.raises(StaleLease):
        FENCED[op](store, job, job.fencing_token)
    assert _written(store, job.id) == before


@dataclass
class Paused:
    """Holds one thread inside its transaction, right after a statement `matches`."""

    matches: Callable[[str], bool]
    thread: threading.Thread | None = None
    reached: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    backend_pid: int | None = None  # PostgreSQL: the paused transaction's server process

    def after_execute(self, conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if threading.current_thread() is not self.thread or self.reached.is_set():
            return
        if self.matches(" ".join(statement.split())):
            info = getattr(conn.connection.dbapi_connection, "info", None)
            self.backend_pid = getattr(info, "backend_pid", None)
            self.reached.set()
            assert self.go.wait(30), "never released"


@contextmanager
def _paused(store: SqlStore, matches: Callable[[str], bool]) -> Iterator[Paused]:  # noqa: F811
    pause = Paused(matches)
    event.listen(store.engine, "after_cursor_execute", pause.after_execute)
    try:
        yield pause
    finally:
        pause.go.set()
        event.remove(store.engine, "after_cursor_execute", pause.after_execute)


class Outcome:
    """A call run in its own thread: its result or error, and when it ended."""

    def __init__(self, call: Callable[[], object], order: list[str], name: str) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call, order, name))

    def _run(self, call: Callable[[], object], order: list[str], name: str) -> None:
        try:
            self.result = call()
        except BaseException as exc:  # reported by the test, in its own thread
            self.error = exc
        order.append(name)

    def join(self) -> None:
        self.thread.join(30)
        assert not self.thread.is_alive()


def _blocked_on(store: SqlStore, pause: Paused, waiter: Outcome) -> None:  # noqa: F811
    """Return once `waiter` waits for the paused transaction's lock, or has finished."""
    began = time.monotonic()
    while waiter.thread.is_alive() and time.monotonic() - began < 20:
        if pause.backend_pid is None:  # SQLite
            if time.monotonic() - began > SQLITE_BLOCKED_S:
                return
        elif _pg_waiters(store, pause.backend_pid):
            return
        time.sleep(0.02)


def _pg_waiters(store: SqlStore, pid: int) -> int:  # noqa: F811
    query = text("SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))")
    with store.engine.connect() as conn:
        return int(conn.execute(query, {"pid": pid}).scalar_one())


def _is_settling_update(statement: str) -> bool:
    return statement.upper().startswith("UPDATE JOBS")


def _is_owner_check(statement: str) -> bool:
    upper = statement.upper()
    return upper.startswith("SELECT") and " FROM JOBS " in f"{upper} "


@pytest.mark.parametrize("op", list(FENCED))
@pytest.mark.parametrize("reclaim", [False, True], ids=["lost", "reclaimed"])
def test_a_write_racing_the_settler_is_refused_once_the_token_changed(
    store: SqlStore,  # noqa: F811
    op: str,
    reclaim: bool,
) -> None:
    """The settler has changed the token but not committed yet when the old owner writes."""
    job = _claimed(store)
    order: list[str] = []
    with _paused(store, _is_settling_update) as pause:
        settler = Outcome(lambda: _settle(store, False), order, "settled")
        pause.thread = settler.thread
        settler.thread.start()
        assert pause.reached.wait(10)
        writer = Outcome(lambda: FENCED[op](store, job, job.fencing_token), order, "written")
        writer.thread.start()
        _blocked_on(store, pause, writer)
        assert writer.thread.is_alive(), f"{op} did not wait for the settler: {writer.error!r}"
        pause.go.set()
        settler.join()
        writer.join()
    assert settler.error is None and settler.result == [job.id]
    assert isinstance(writer.error, StaleLease), writer.error
    assert store.job_stages(job.id) == [] and store.once_keys(job.id) == []
    assert store.read_logs(job.id, -1) == [] and store.list_artifacts(job.id) == []
    if reclaim:  # the new owner's same write goes through: the stale one left nothing behind
        current = store.claim_next("w2", time.time(), 30)
        assert current is not None and current.id == job.id
        FENCED[op](store, current, current.fencing_token)
        with pytest.raises(StaleLease):
            FENCED[op](store, job, job.fencing_token)


@pytest.mark.parametrize("op", CHECK_THEN_WRITE)
def test_a_settler_cannot_change_the_token_between_a_writes_check_and_its_insert(
    store: SqlStore,  # noqa: F811
    op: str,
) -> None:
    """The owner has passed its check but not written yet when the settler comes: the settler
    skips the locked job (PostgreSQL) or waits for the write (SQLite), never slips between."""
    job = _claimed(store)
    order: list[str] = []
    with _paused(store, _is_owner_check) as pause:
        writer = Outcome(lambda: FENCED[op](store, job, job.fencing_token), order, "written")
        pause.thread = writer.thread
        writer.thread.start()
        assert pause.reached.wait(10)
        settler = Outcome(lambda: _settle(store, False), order, "settled")
        settler.thread.start()
        _blocked_on(store, pause, settler)
        pause.go.set()
        writer.join()
        settler.join()
    assert writer.error is None and settler.error is None, (writer.error, settler.error)
    still_running = [] if op == "release_job" else [job.id]  # a release settles it itself
    if order == ["written", "settled"]:  # the settler waited for the write to commit
        assert settler.result == still_running
    else:  # it skipped the job the write had locked; the next round settles it
        assert settler.result == []
        assert _settle(store, False) == still_running


def test_a_stage_and_its_artifacts_are_recorded_together_or_not_at_all(
    store: SqlStore,  # noqa: F811
) -> None:
    job = _claimed(store)
    token = job.fencing_token
    files = store.commit_stage(
        job.id, token, "clean", [_artifact(job, "a"), _artifact(job, "b")], 1
    )
    [stage] = store.job_stages(job.id)
    assert stage["files"] == files and [f["path"] for f in files] == ["a", "b"]
    assert [a.path for a in store.list_artifacts(job.id)] == ["a", "b"]
    with pytest.raises(Conflict):  # committed once: the repeat adds no artifact either
        store.commit_stage(job.id, token, "clean", [_artifact(job, "c")], 2)
    with pytest.raises(IntegrityError):  # a failing insert takes the stage down with it
        store.commit_stage(job.id, token, "chart", [_artifact(job, "d"), *_same_id(job)], 3)
    assert [s["name"] for s in store.job_stages(job.id)] == ["clean"]
    assert [a.path for a in store.list_artifacts(job.id)] == ["a", "b"]


def _same_id(job: Job) -> list[Artifact]:
    twin = _artifact(job, "e")
    return [twin, replace(twin, path="f")]


def test_a_release_is_recorded_only_for_the_attempt_that_ended_the_job(
    store: SqlStore,  # noqa: F811
) -> None:
    job = _claimed(store)
    released = {"cpu_s": 1.0, "released": 1.0}
    store.record_release(job.id, job.fencing_token, released, None)  # still running: nothing
    found = store.get_job(None, job.id)
    assert found is not None and found.usage == {}
    ended = replace(job, state=JobState.COMPLETED, finished_at=time.time(), usage={"cpu_s": 1.0})
    store.finish_job(replace(ended, usage=ended.usage | {"released": 0.0}), job.fencing_token)
    store.record_release(job.id, job.fencing_token - 1, released, None)  # another attempt's
    found = store.get_job(None, job.id)
    assert found is not None and found.usage == {"cpu_s": 1.0, "released": 0.0}
    left = {"cpu_s": 1.0, "released": 0.0}
    store.record_release(job.id, job.fencing_token, left, "not released: cgroup")
    found = store.get_job(None, job.id)
    assert found is not None and found.detail == "not released: cgroup"
    assert found.usage["released"] == 0.0
    store.record_release(job.id, job.fencing_token, released, None)
    found = store.get_job(None, job.id)
    assert found is not None and found.usage == released
    assert found.detail == "not released: cgroup"  # a later verified release keeps what was said


def test_a_jobs_end_writes_its_last_logs_and_outputs_with_it(
    store: SqlStore,  # noqa: F811
) -> None:
    job = _claimed(store)
    store.append_log(job.id, job.fencing_token, "stdout", b"first ")
    _finish(store, job, job.fencing_token)
    found = store.get_job(None, job.id)
    assert found is not None and found.state is JobState.COMPLETED
    assert [(c.seq, c.data) for c in store.read_logs(job.id, -1)] == [(0, b"first "), (1, b"last")]
    assert [a.path for a in store.list_artifacts(job.id)] == ["clean.csv"]
