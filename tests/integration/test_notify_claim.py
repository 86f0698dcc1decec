"""Submit → claim is a notification, not a poll: over SQLite (unix sockets) and PostgreSQL.

The API and the worker each get a notifier of their own, as two processes would: a socket
notifier on one data dir (the embedded default), or PostgreSQL LISTEN/NOTIFY (scale-out).
The worker's fallback poll and housekeeping are set to 5 s, so a claim within a fraction of a
second can only come from the notification.
"""

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from sandcell.ports.notify import JOB_DONE, JOB_QUEUED, Notifier
from sandcell.services.worker import Worker, WorkerConfig
from sandcell.store.notify_local import SocketNotifier
from sandcell.store.notify_pg import PostgresNotifier
from sandcell.store.sql import SqlStore
from tests.conftest import build_api, sqlite_store
from tests.fakes import FakeImages, HostProcessRuntime

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SLOW_POLL_S = 5.0
NotifierFactory = Callable[[], Notifier]


@pytest.fixture
def pg_schema() -> Iterator[str]:
    schema = f"sc_notify_{secrets.token_hex(4)}"
    admin = create_engine(PG_URL)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield schema
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def _pg_notifier() -> PostgresNotifier:
    notifier = PostgresNotifier(PG_URL)
    assert notifier.wait_listening(10), "LISTEN never took effect"
    return notifier


def test_a_notify_on_one_connection_wakes_a_listener_on_another() -> None:
    listener = _pg_notifier()
    heard: list[str] = []
    woken = threading.Event()
    listener.listen(JOB_DONE, lambda payload: (heard.append(payload), woken.set()))
    try:
        with psycopg.connect(PG_URL.replace("+psycopg", ""), autocommit=True) as other:
            started = time.monotonic()
            other.execute("SELECT pg_notify(%s, %s)", (JOB_DONE, "job_raw"))
            assert woken.wait(5)
            assert time.monotonic() - started < 1
        woken.clear()
        sender = PostgresNotifier(PG_URL)  # and between two notifiers, as API and worker
        try:
            sender.notify(JOB_DONE, "job_sent")
            sender.notify(JOB_QUEUED, "not for this listener")
            assert woken.wait(5)
        finally:
            sender.close()
        assert [p for p in heard if p] == ["job_raw", "job_sent"]
    finally:
        listener.close()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[SqlStore, NotifierFactory]]:
    if request.param == "sqlite":
        yield sqlite_store(tmp_path / "test.db"), lambda: SocketNotifier(tmp_path / "notify")
        return
    schema = request.getfixturevalue("pg_schema")
    engine = create_engine(PG_URL, connect_args={"options": f"-csearch_path={schema}"})
    store = SqlStore(engine)
    store.create_schema()
    yield store, _pg_notifier
    engine.dispose()


def test_a_submitted_job_is_claimed_without_waiting_for_the_poll(
    backend: tuple[SqlStore, NotifierFactory], tmp_path: Path
) -> None:
    store, notifier = backend
    api_side, worker_side = notifier(), notifier()
    config = WorkerConfig(
        "wrk_notify", slots=1, lease_s=10, poll_s=SLOW_POLL_S, housekeeping_s=SLOW_POLL_S
    )
    with build_api(tmp_path, store) as api:
        api.services.jobs.notifier = api_side
        worker = Worker(
            store, api.blobs, HostProcessRuntime(), FakeImages("python"), config,
            notifier=worker_side,
        )  # fmt: skip
        stop = threading.Event()
        serving = threading.Thread(target=worker.serve, args=(stop,))
        serving.start()
        try:
            alice = api.tenant("alice")
            # The worker's first tick (registration, housekeeping on cold connections) claims
            # a job submitted while it runs; under load it can take a second. Once a first
            # job is done, the worker waits, and from then on only a wake-up claims.
            assert _run(api.http, alice)["state"] == "completed"
            records = [_run(api.http, alice) for _ in range(3)]
        finally:
            stop.set()
            serving.join(10)
            api_side.close()
            worker_side.close()
    assert not serving.is_alive(), "stop did not wake the claim loop"
    assert all(r["state"] == "completed" for r in records), records
    # Far below the 5 s poll; generous for a loaded 2-core machine.
    assert max(r["queue_ms"] for r in records) < 1000, [r["queue_ms"] for r in records]


def _run(http: TestClient, headers: dict[str, str]) -> dict[str, Any]:
    job = http.post("/v1/jobs", json={"code": "print(1)"}, headers=headers).json()
    answer = http.get(f"/v1/jobs/{job['id']}", params={"wait": 20}, headers=headers)
    record: dict[str, Any] = answer.json()
    return record
