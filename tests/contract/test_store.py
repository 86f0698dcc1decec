"""One contract suite for the store, run against SQLite and the real PostgreSQL."""

import base64
import secrets
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from sandcell.domain.cells import CELL_CHARS, SessionCell, recorded_cell
from sandcell.domain.errors import Conflict, IdempotencyMismatch, NotFound, StaleLease
from sandcell.domain.ids import new_id
from sandcell.domain.limits import Limits
from sandcell.domain.records import ApiKey, Artifact, Job, JobSpec, StoredFile, Tenant, WorkerInfo
from sandcell.domain.sessions import Session, SessionState
from sandcell.domain.states import JobState, Reason
from sandcell.store.sql import SqlStore
from tests.conftest import sqlite_store

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqlStore]:
    if request.param == "sqlite":
        yield sqlite_store(tmp_path / "contract.db")
        return
    schema = f"sc_test_{secrets.token_hex(4)}"
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    engine = create_engine(PG_URL, connect_args={"options": f"-csearch_path={schema}"})
    pg = SqlStore(engine)
    pg.create_schema()
    try:
        yield pg
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def _tenant(store: SqlStore, name: str = "t") -> Tenant:
    tenant = Tenant(new_id("ten"), name, {}, None, time.time())
    store.add_tenant(tenant)
    return tenant


def _job(tenant: Tenant, **extra: object) -> Job:
    spec = JobSpec("python", "print(1)", None, [], Limits(), {})
    return Job(new_id("job"), tenant.id, JobState.ACCEPTED, spec, time.time(), None, **extra)  # type: ignore[arg-type]


def test_tenant_names_are_unique(store: SqlStore) -> None:
    _tenant(store, "same")
    with pytest.raises(Conflict):
        _tenant(store, "same")


def test_keys_revoked_since_a_time_are_listed_and_no_others(store: SqlStore) -> None:
    tenant = _tenant(store)
    for key_id in ("old", "new", "live"):
        store.add_api_key(ApiKey(key_id, tenant.id, ["jobs"], 100.0), "hash-" + key_id)
    assert store.revoke_api_key("old", 200.0) and store.revoke_api_key("new", 300.0)
    assert store.revoked_key_ids(300.0) == ["new"]
    assert sorted(store.revoked_key_ids(150.0)) == ["new", "old"]
    assert store.revoked_key_ids(301.0) == []


def test_idempotent_insert_returns_the_first_job_and_refuses_another_body(store: SqlStore) -> None:
    tenant = _tenant(store)
    first = store.add_job(_job(tenant), ("key", "body-a"))
    again = store.add_job(_job(tenant), ("key", "body-a"))
    assert again.id == first.id
    with pytest.raises(IdempotencyMismatch):
        store.add_job(_job(tenant), ("key", "body-b"))


def test_concurrent_idempotent_inserts_make_one_job(store: SqlStore) -> None:
    tenant = _tenant(store)
    ids: list[str] = []
    barrier = threading.Barrier(10)

    def insert() -> None:
        barrier.wait()
        ids.append(store.add_job(_job(tenant), ("race", "same")).id)

    threads = [threading.Thread(target=insert) for _ in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 10 and len(set(ids)) == 1


def test_concurrent_claims_never_hand_one_job_to_two_workers(store: SqlStore) -> None:
    tenant = _tenant(store)
    for _ in range(20):
        store.add_job(_job(tenant), None)
    claimed: list[str] = []

    def claim(worker: str) -> None:
        while (job := store.claim_next(worker, time.time(), 30)) is not None:
            claimed.append(job.id)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(claimed) == 20 and len(set(claimed)) == 20


def test_a_claim_takes_the_oldest_queued_jobs_up_to_what_it_asks_in_one_go(
    store: SqlStore,
) -> None:
    tenant = _tenant(store)
    now = time.time()
    queued = [store.add_job(replace(_job(tenant), accepted_at=now + n), None) for n in range(5)]
    first = store.claim_jobs("w1", now, 30, 3)
    assert [job.id for job in first] == [job.id for job in queued[:3]]
    assert all(job.state is JobState.RUNNING and job.worker_id == "w1" for job in first)
    assert all(job.fencing_token == 1 for job in first)
    # Without the look first (a submit was heard); fewer than asked: the queue is empty.
    rest = store.claim_jobs("w2", now, 30, 3, look_first=False)
    assert [job.id for job in rest] == [job.id for job in queued[3:]]
    assert store.claim_jobs("w1", now, 30, 3) == []
    assert store.claim_jobs("w1", now, 30, 3, look_first=False) == []


def test_concurrent_batch_claims_never_hand_one_job_to_two_workers(store: SqlStore) -> None:
    tenant = _tenant(store)
    for _ in range(30):
        store.add_job(_job(tenant), None)
    claimed: list[str] = []

    def claim(worker: str) -> None:
        while jobs := store.claim_jobs(worker, time.time(), 30, 4):
            claimed.extend(job.id for job in jobs)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(claimed) == 30 and len(set(claimed)) == 30


def test_a_job_past_its_expiry_is_never_claimed_even_before_it_is_ended(
    store: SqlStore,
) -> None:
    tenant = _tenant(store)
    now = time.time()
    expired = store.add_job(replace(_job(tenant), expires_at=now - 1), None)
    later = store.add_job(replace(_job(tenant), expires_at=now + 60), None)
    claimed = store.claim_next("w1", now, 30)
    assert claimed is not None and claimed.id == later.id
    assert store.claim_next("w1", now, 30) is None
    assert store.expire_unstarted(now) == [expired.id]


def test_fencing_refuses_writes_from_a_worker_that_lost_its_lease(store: SqlStore) -> None:
    tenant = _tenant(store)
    store.add_job(_job(tenant), None)
    job = store.claim_next("w1", time.time(), lease_s=0.01)
    assert job is not None
    time.sleep(0.05)
    assert store.fail_lost_jobs(time.time()) == [job.id]
    with pytest.raises(StaleLease):
        store.append_log(job.id, job.fencing_token, "stdout", b"late")
    artifact = Artifact(new_id("art"), tenant.id, job.id, "x", 1, "0" * 64, time.time())
    with pytest.raises(StaleLease):
        store.add_artifact(artifact, job.fencing_token)
    assert not store.renew_lease(job.id, job.fencing_token, time.time(), 30)
    found = store.get_job(None, job.id)
    assert found is not None and found.reason is Reason.WORKER_LOST


def test_logs_keep_order_and_bytes(store: SqlStore) -> None:
    tenant = _tenant(store)
    store.add_job(_job(tenant), None)
    job = store.claim_next("w1", time.time(), 30)
    assert job is not None
    for i in range(5):
        store.append_log(
            job.id, job.fencing_token, "stdout" if i % 2 else "stderr", bytes([i, 0, 255])
        )
    chunks = store.read_logs(job.id, -1)
    assert [c.data for c in chunks] == [bytes([i, 0, 255]) for i in range(5)]
    assert [c.seq for c in store.read_logs(job.id, chunks[2].seq)] == [chunks[3].seq, chunks[4].seq]


def test_other_tenants_see_nothing(store: SqlStore) -> None:
    alice, bob = _tenant(store, "alice"), _tenant(store, "bob")
    job = store.add_job(_job(alice), None)
    assert store.get_job(bob.id, job.id) is None
    assert store.request_cancel(bob.id, job.id, time.time()) is None
    assert store.retire_job(bob.id, job.id, time.time()) is None
    assert store.list_jobs(bob.id, None, None, 10) == []


def test_a_lost_job_with_attempts_left_is_requeued_and_listed(store: SqlStore) -> None:
    tenant = _tenant(store)
    spec = JobSpec("python", "print(1)", None, [], Limits(), {}, retry={"max_attempts": 2})
    store.add_job(Job(new_id("job"), tenant.id, JobState.ACCEPTED, spec, time.time(), None), None)
    first = store.claim_next("w1", time.time(), lease_s=0.01)
    assert first is not None
    time.sleep(0.05)
    store.fail_lost_jobs(time.time())
    again = store.claim_next("w2", time.time(), lease_s=0.01)
    assert again is not None and again.id == first.id
    assert again.fencing_token > first.fencing_token + 1
    assert [a["worker_id"] for a in again.attempts] == ["w1"]
    time.sleep(0.05)
    store.fail_lost_jobs(time.time())
    final = store.get_job(None, first.id)
    assert final is not None and (final.state, final.reason) == (
        JobState.FAILED,
        Reason.WORKER_LOST,
    )
    assert [a["worker_id"] for a in final.attempts] == ["w1", "w2"]


def test_a_lost_attempt_names_the_sandbox_it_ran_in(store: SqlStore) -> None:
    tenant = _tenant(store)
    spec = JobSpec("python", "print(1)", None, [], Limits(), {}, retry={"max_attempts": 2})
    store.add_job(Job(new_id("job"), tenant.id, JobState.ACCEPTED, spec, time.time(), None), None)
    first = store.claim_next("w1", time.time(), lease_s=0.05)
    assert first is not None
    store.mark_started(first.id, first.fencing_token, time.time(), "sha256:x", "pool-python-ab12")
    running = store.get_job(None, first.id)
    assert running is not None and running.sandbox_id == "pool-python-ab12"
    time.sleep(0.1)
    store.fail_lost_jobs(time.time())
    again = store.get_job(None, first.id)
    assert again is not None and again.state is JobState.ACCEPTED
    assert [a["sandbox_id"] for a in again.attempts] == ["pool-python-ab12"]
    assert again.sandbox_id is None  # the next attempt has not started anywhere yet


def test_a_workers_pool_and_health_figures_come_back_with_it(store: SqlStore) -> None:
    pools = {"jobs": {"ready": {"python": 1}, "memory_bytes": 5, "hits": {"python": 2}}}
    health = {"quarantined_uids": 2}
    info = WorkerInfo(new_id("wrk"), "h", "bwrap", "1", time.time(), None, pools, health)
    store.worker_seen(info, time.time())
    live = [w for w in store.live_workers(time.time() - 10) if w.id == info.id]
    assert [(w.pools, w.health) for w in live] == [(pools, health)]
    store.worker_seen(replace(info, pools=None, health=None), time.time())
    live = [w for w in store.live_workers(time.time() - 10) if w.id == info.id]
    assert [(w.pools, w.health) for w in live] == [(None, None)]


def test_one_live_worker_is_read_by_its_id(store: SqlStore) -> None:
    now = time.time()
    seen, other = (WorkerInfo(new_id("wrk"), "h", "gvisor", "1", now, "http://w") for _ in "ab")
    store.worker_seen(seen, now)
    store.worker_seen(other, now)
    found = store.live_worker(seen.id, now - 10)
    assert found is not None and (found.id, found.url) == (seen.id, "http://w")
    assert store.live_worker(seen.id, now + 1) is None  # not seen since
    assert store.live_worker(new_id("wrk"), now - 10) is None
    store.worker_stopped(seen.id, time.time())
    assert store.live_worker(seen.id, now - 10) is None
    assert store.live_worker(other.id, now - 10) is not None


def test_metrics_queries_count_states_and_phases(store: SqlStore) -> None:
    tenant = _tenant(store)
    store.add_job(_job(tenant), None)
    store.add_job(_job(tenant), None)
    job = store.claim_next("w1", time.time(), 30)
    assert job is not None
    assert store.job_counts() == {("accepted", ""): 1, ("running", ""): 1}
    buckets, total, count = store.phase_histogram("queue", [0.0, 10.0, 1e9])
    assert count == 1 and buckets[-1] == 1 and buckets[1] == 1 and total >= 0
    assert store.phase_histogram("run", [1.0]) == ([0], 0.0, 0)


def _session(store: SqlStore, tenant: Tenant) -> Session:
    now = time.time()
    session = Session(
        new_id("ses"), tenant.id, SessionState.RUNNING, {"image": "python"}, now, now, now + 60, 60
    )
    store.add_session(session)
    return session


def _cell(session: Session, code: str, **outcome: object) -> SessionCell:
    now = time.time()
    return recorded_cell(session.id, session.tenant_id, code, outcome, now, now + 0.01)


def test_cells_are_numbered_per_session_and_only_the_newest_are_kept(store: SqlStore) -> None:
    tenant = _tenant(store)
    first, other = _session(store, tenant), _session(store, tenant)
    for i in range(5):
        assert store.add_session_cell(_cell(first, f"x = {i}"), keep=3).seq == i + 1
    assert store.add_session_cell(_cell(other, "y = 1"), keep=3).seq == 1
    assert [c.seq for c in store.session_cells(tenant.id, first.id, None, 10)] == [3, 4, 5]
    assert [c.code for c in store.session_cells(tenant.id, first.id, None, 2)] == ["x = 3", "x = 4"]
    assert [c.seq for c in store.session_cells(tenant.id, first.id, 3, 10)] == [4, 5]
    assert [c.seq for c in store.session_cells(tenant.id, first.id, 3, 1)] == [4]
    assert store.session_cells(tenant.id, first.id, 5, 10) == []
    assert [c.code for c in store.session_cells(tenant.id, other.id, None, 10)] == ["y = 1"]


def test_another_tenants_cells_are_neither_read_nor_written(store: SqlStore) -> None:
    alice, bob = _tenant(store, "alice"), _tenant(store, "bob")
    session = _session(store, alice)
    store.add_session_cell(_cell(session, "secret = 1"), keep=10)
    assert store.session_cells(bob.id, session.id, None, 10) == []
    assert store.session_cells(bob.id, session.id, 0, 10) == []
    with pytest.raises(NotFound):
        store.add_session_cell(replace(_cell(session, "x"), tenant_id=bob.id), keep=10)
    with pytest.raises(NotFound):
        store.add_session_cell(replace(_cell(session, "x"), session_id="ses_nope"), keep=10)


def test_concurrent_cells_get_distinct_increasing_numbers(store: SqlStore) -> None:
    session = _session(store, _tenant(store))
    seqs: list[int] = []
    barrier = threading.Barrier(8)

    def record(i: int) -> None:
        barrier.wait()
        seqs.append(store.add_session_cell(_cell(session, f"c{i}"), keep=100).seq)

    threads = [threading.Thread(target=record, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(seqs) == list(range(1, 9))


def test_hostile_cell_output_round_trips_as_text(store: SqlStore) -> None:
    session = _session(store, _tenant(store))
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(range(256))).decode()
    hostile = "<script>alert(1)</script>\x1b[31mred\x1b[0m nul:\x00 lone:\ud800 ok:é😀"
    cell = _cell(
        session,
        "print('<b>')",
        stdout=hostile,
        stderr="\x00" * 3,
        result="'<img src=x onerror=alert(1)>'",
        display=[{"mime": "image/png", "data": png}, {"mime": "text/html", "data": hostile}],
        error={"ename": "E\x00", "evalue": hostile, "traceback": [hostile, "\ud83d"]},
        execution_count=7,
        timed_out=True,
    )
    store.add_session_cell(cell, keep=10)
    [back] = store.session_cells(session.tenant_id, session.id, None, 10)
    assert back == replace(cell, seq=1)
    assert back.stdout.startswith("<script>alert(1)</script>\x1b[31mred")
    assert "\x00" not in back.stdout and back.stdout.endswith("nul:\ufffd lone:? ok:é😀")
    assert back.stderr == "\ufffd" * 3
    assert back.display[0] == {"mime": "image/png", "data": png}
    assert back.error is not None and back.error["traceback"][1] == "?"
    assert (back.execution_count, back.timed_out, back.truncated) == (7, True, False)


def test_a_big_cell_is_stored_capped_and_says_so(store: SqlStore) -> None:
    session = _session(store, _tenant(store))
    big_png = "A" * (CELL_CHARS + 1)
    cell = _cell(
        session,
        "print('x' * 10**6)",
        stdout="x" * 10**6,
        display=[{"mime": "image/png", "data": "iVBOR"}, {"mime": "image/png", "data": big_png}],
    )
    store.add_session_cell(cell, keep=10)
    [back] = store.session_cells(session.tenant_id, session.id, None, 10)
    assert back.truncated
    assert back.stdout.startswith("x" * 1000) and len(back.stdout) < 10**6
    assert back.stdout.endswith("more characters not kept in the history]")
    assert back.display[0] == {"mime": "image/png", "data": "iVBOR"}
    assert back.display[1]["mime"] == "text/plain" and back.display[1]["omitted"] == "image/png"
    stored = len(back.code) + len(back.stdout) + sum(len(d["data"]) for d in back.display)
    assert stored < CELL_CHARS + 1000


def test_quota_overrides_are_patched_and_reset(store: SqlStore) -> None:
    tenant = Tenant(new_id("ten"), "q", {}, None, time.time(), {"sessions": 2, "burst": 5})
    store.add_tenant(tenant)
    patched = store.patch_tenant_quotas(tenant.id, {"sessions": 9, "storage_mb": 1})
    assert patched is not None and patched.quotas == {"sessions": 9, "burst": 5, "storage_mb": 1}
    reset = store.patch_tenant_quotas(tenant.id, {"burst": None, "jobs_per_minute": 1.5})
    assert reset is not None and reset.quotas == {
        "sessions": 9,
        "storage_mb": 1,
        "jobs_per_minute": 1.5,
    }
    found = store.get_tenant(tenant.id)
    assert found is not None and found.quotas == reset.quotas
    assert store.patch_tenant_quotas("ten_nope", {"sessions": 1}) is None


def test_outputs_of_a_page_of_jobs_match_each_jobs_own_reads(store: SqlStore) -> None:
    tenant = _tenant(store)
    for _ in range(3):
        store.add_job(_job(tenant), None)
    claimed = [store.claim_next("w1", time.time(), 30) for _ in range(3)]
    made, staged, idle = [job for job in claimed if job is not None]
    for path in ("b.png", "a.csv"):
        artifact = Artifact(new_id("art"), tenant.id, made.id, path, 1, "0" * 64, time.time())
        store.add_artifacts(made.id, [artifact], made.fencing_token)
    kept = Artifact(new_id("art"), tenant.id, staged.id, "clean.csv", 2, "1" * 64, time.time())
    store.commit_stage(staged.id, staged.fencing_token, "clean", [kept], time.time())
    ids = [made.id, staged.id, idle.id]
    found = store.outputs_of(ids)
    assert list(found) == ids and store.outputs_of([]) == {}
    for job_id in ids:
        assert found[job_id] == (store.list_artifacts(job_id), store.job_stages(job_id))
    assert [a.path for a in found[made.id][0]] == ["a.csv", "b.png"]
    assert [s["name"] for s in found[staged.id][1]] == ["clean"] and found[idle.id] == ([], [])
    for job_id in ids:  # one job's record, read together, as a tenant and as the service
        for reader in (tenant.id, None):
            job = store.get_job(reader, job_id)
            assert job is not None
            assert store.job_with_outputs(reader, job_id) == (job, *found[job_id])
    other = _tenant(store, "other")
    assert store.job_with_outputs(other.id, made.id) is None
    assert store.job_with_outputs(tenant.id, "job_nope") is None


def test_stored_bytes_follow_files_and_artifacts_in_and_out(store: SqlStore) -> None:
    """Admission reads the tenant's running total: it must equal the sizes really stored,
    through uploads, job outputs, committed stages, deletes and retirements, and never count
    a delete twice."""
    tenant, other = _tenant(store), _tenant(store, "other")

    def upload(size: int) -> StoredFile:
        stored = StoredFile(new_id("file"), tenant.id, "in.csv", size, "2" * 64, time.time())
        store.add_file(stored)
        return stored

    kept, dropped = upload(1000), upload(300)
    store.add_job(_job(tenant), None)
    job = store.claim_next("w1", time.time(), 30)
    assert job is not None
    outputs = [Artifact(new_id("art"), tenant.id, job.id, p, 40, "0" * 64, 0.0) for p in "ab"]
    store.add_artifacts(job.id, outputs, job.fencing_token)
    staged = Artifact(new_id("art"), tenant.id, job.id, "clean.csv", 5, "1" * 64, time.time())
    store.commit_stage(job.id, job.fencing_token, "clean", [staged], time.time())
    assert store.storage_bytes(tenant.id) == 1000 + 300 + 2 * 40 + 5
    racers = [
        threading.Thread(target=store.delete_file, args=(tenant.id, dropped.id)) for _ in range(2)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert not store.delete_file(other.id, kept.id)  # not its file: nothing moves
    assert store.storage_bytes(tenant.id) == 1000 + 2 * 40 + 5
    store.delete_job_data(job.id)
    store.delete_job_data(job.id)
    assert store.storage_bytes(tenant.id) == 1000 and store.storage_bytes(other.id) == 0


def test_housekeeping_with_nothing_due_never_waits_for_the_write_lock(tmp_path: Path) -> None:
    """It runs every second on every worker; on SQLite a write transaction would queue behind
    the API's writers (and they behind it) just to find that nothing is due."""
    store = sqlite_store(tmp_path / "busy.db")
    writer = sqlite3.connect(tmp_path / "busy.db", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process holds the write lock meanwhile
    answers: list[object] = []

    def housekeeping() -> None:
        now = time.time()
        answers.append(store.purge_idempotency_keys(now - 60))
        answers.append(store.expire_unstarted(now))
        answers.append(store.fail_lost_jobs(now))
        answers.append(store.fail_orphan_sessions([], now))

    worker = threading.Thread(target=housekeeping, daemon=True)
    worker.start()
    worker.join(5)  # the store's busy timeout is 30 s: a write would still be waiting
    alive = worker.is_alive()
    writer.execute("ROLLBACK")
    writer.close()
    worker.join(35)
    assert not alive and answers == [0, [], [], []]
