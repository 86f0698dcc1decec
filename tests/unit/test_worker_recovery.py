"""Worker recovery paths over the host-process fake runtime: a lease lost in a store outage,
a stage that cannot be restored, a full artifact disk at output collection."""

import hashlib
import io
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sandcell.artifacts.filesystem import FilesystemBlobStore
from sandcell.domain.errors import StoreUnavailable
from sandcell.domain.states import JobState
from sandcell.ports.store import Store
from sandcell.services.stages import StageRecorder
from sandcell.services.worker import Worker, WorkerConfig
from tests.conftest import Api
from tests.fakes import FakeImages, HostProcessRuntime
from tests.unit.test_guest_channel import FillingBlobs


def _worker(api: Api) -> Worker:
    config = WorkerConfig("wrk_test", slots=2, lease_s=5, heartbeat_s=0.1, poll_s=0.01)
    return Worker(api.services.store, api.blobs, HostProcessRuntime(), FakeImages("python"), config)


class StoreOutage:
    """The store, until `down` is set (or `from_call` is called the `nth` time): then every
    call fails as a lost database does."""

    def __init__(self, store: Store, from_call: str | None = None, nth: int = 1) -> None:
        self.store, self.down, self.refused = store, threading.Event(), set[str]()
        self.from_call, self.calls_left = from_call, nth

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.store, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            if name == self.from_call:
                self.calls_left -= 1
                if self.calls_left == 0:
                    self.down.set()
            if self.down.is_set():
                self.refused.add(name)
                raise StoreUnavailable()
            return real(*args, **kwargs)

        return call


def test_a_lease_that_runs_out_in_a_store_outage_stops_the_job_and_writes_nothing(
    api: Api, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    alice = api.tenant("alice")
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    job_id = api.http.post("/v1/jobs", json={"code": code}, headers=alice).json()["id"]
    store = StoreOutage(api.services.store)
    config = WorkerConfig("wrk_out", slots=1, lease_s=1, heartbeat_s=0.1, poll_s=0.01)
    worker = Worker(store, api.blobs, HostProcessRuntime(), FakeImages("python"), config)  # type: ignore[arg-type]
    job = store.claim_next("wrk_out", time.time(), config.lease_s)
    assert job is not None and job.id == job_id
    runner = threading.Thread(target=worker._run_guarded, args=(job,))  # as the pool runs it
    runner.start()
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(1.5)  # renewed across a few half-lives while the store is up
    assert runner.is_alive()
    store.down.set()
    began = time.monotonic()
    runner.join(10)
    assert not runner.is_alive() and time.monotonic() - began < 1 + 3  # the lease, then a stop
    assert not Path(f"/proc/{pid_file.read_text()}").exists()  # the job's process is gone
    assert store.refused <= {"cancels_requested", "renew_lease"}  # nothing written once lost
    assert "lease ran out while the store was unreachable" in caplog.text
    assert "its sandbox was stopped (released); leaving it to its new owner" in caplog.text
    store.down.clear()
    left = api.services.store.get_job(None, job_id)
    assert left is not None and left.state is JobState.RUNNING  # as the outage left it
    assert api.services.store.fail_lost_jobs(time.time()) == [job_id]  # settled as lost
    record = api.http.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert (record["state"], record["reason"]) == ("failed", "worker_lost")


@pytest.mark.parametrize("damage", ["tampered", "missing"])
def test_a_stage_that_fails_its_checksum_on_restore_ends_the_job_clearly(
    api: Api, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    alice = api.tenant("alice")
    body = {"code": "print(1)", "retry": {"max_attempts": 2}}
    job_id = api.http.post("/v1/jobs", json=body, headers=alice).json()["id"]
    store = api.services.store
    first = store.claim_next("wrk_test", time.time(), lease_s=0.01)
    assert first is not None
    recorder = StageRecorder(store, api.blobs, first, first.fencing_token)
    [stored] = recorder.commit_stage("clean", [("clean.csv", io.BytesIO(b"a,b\n"))])
    time.sleep(0.05)
    assert store.fail_lost_jobs(time.time()) == [job_id]
    blob = api.blobs.path(str(stored["sha256"]))
    blob.write_bytes(b"a,c\n") if damage == "tampered" else blob.unlink()
    second = store.claim_next("wrk_test", time.time(), 5)
    assert second is not None
    _worker(api)._run_guarded(second)
    record = api.http.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert (record["state"], record["reason"]) == ("failed", "internal")
    expected = {
        "tampered": "stage clean output clean.csv failed its checksum on restore",
        "missing": "stage clean output clean.csv is missing from artifact storage",
    }
    assert record["detail"] == expected[damage]
    assert [a["reason"] for a in record["attempts"]] == ["worker_lost", "internal"]
    assert not [r for r in caplog.records if r.exc_info]  # a clear end, no crash trace
    assert "internal error in the worker" not in caplog.text


def test_a_full_artifact_disk_publishes_none_of_the_outputs(api: Api) -> None:
    alice = api.tenant("alice")
    code = "open('/output/a.txt','w').write('a' * 10); open('/output/b.bin','w').write('b' * 999)"
    job_id = api.http.post("/v1/jobs", json={"code": code}, headers=alice).json()["id"]
    blobs = FillingBlobs(api.blobs, room=100)
    config = WorkerConfig("wrk_full", slots=1, lease_s=5, heartbeat_s=0.1, poll_s=0.01)
    worker = Worker(api.services.store, blobs, HostProcessRuntime(), FakeImages(), config)  # type: ignore[arg-type]
    job = api.services.store.claim_next("wrk_full", time.time(), 5)
    assert job is not None
    worker.run_job(job)
    record = api.http.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert (record["state"], record["reason"]) == ("failed", "internal")
    assert record["detail"] == "artifact storage is full: output b.bin could not be stored"
    assert record["outputs"] == []  # a.txt was stored, but a job's outputs come all or none
    assert not api.blobs.exists(hashlib.sha256(b"a" * 10).hexdigest())


def test_a_blob_stored_again_since_is_not_deleted_as_unused(tmp_path: Path) -> None:
    """Another job may have stored the same bytes and not recorded its artifact yet."""
    blobs = FilesystemBlobStore(tmp_path)
    sha256, _ = blobs.put(io.BytesIO(b"same bytes"))
    first_stored = blobs.path(sha256).stat().st_mtime
    time.sleep(0.01)
    blobs.put(io.BytesIO(b"same bytes"))  # the other job's put
    assert not blobs.delete(sha256, stored_by=first_stored)
    assert blobs.exists(sha256)
    assert blobs.delete(sha256, stored_by=time.time())
    assert not blobs.exists(sha256)


@pytest.mark.parametrize(
    "outage_from",
    ["get_file", "job_stages"],  # the input's read; the stages' read, at output collection
    ids=["before-the-sandbox", "at-output-collection"],
)
def test_an_outage_longer_than_the_lease_leaves_the_job_to_its_lease(
    api: Api, caplog: pytest.LogCaptureFixture, outage_from: str
) -> None:
    """Not runtime_error nor internal: the store, not the sandbox or the worker, failed, so
    the attempt is lost and the job runs again. (It used to end failed/runtime_error, or
    before the sandbox to escape the worker's guard with a crash trace.)"""
    alice = api.tenant("alice")
    upload = api.http.post("/v1/files", files={"file": ("in.txt", b"x")}, headers=alice).json()
    body = {
        "code": "open('/output/a.txt','w').write('a')",
        "inputs": [{"file_id": upload["id"], "path": "in.txt"}],
        "retry": {"max_attempts": 2},
    }
    job_id = api.http.post("/v1/jobs", json=body, headers=alice).json()["id"]
    store = StoreOutage(api.services.store, from_call=outage_from)
    config = WorkerConfig("wrk_out", slots=1, lease_s=0.5, heartbeat_s=0.1, poll_s=0.01)
    worker = Worker(store, api.blobs, HostProcessRuntime(), FakeImages("python"), config)  # type: ignore[arg-type]
    job = store.claim_next("wrk_out", time.time(), config.lease_s)
    assert job is not None
    worker._run_guarded(job)  # returns: no exception escapes the guard
    assert outage_from in store.refused and store.refused.isdisjoint({"finish_job", "fail_job"})
    assert "the store was unreachable" in caplog.text
    assert "internal error" not in caplog.text
    left = api.services.store.get_job(None, job_id)
    assert left is not None and left.state is JobState.RUNNING and left.reason is None
    assert api.services.store.fail_lost_jobs(time.time() + 60) == [job_id]  # lease expired
    again = api.services.store.claim_next("wrk_test", time.time(), 5)
    assert again is not None and again.id == job_id
    _worker(api).run_job(again)
    record = api.http.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert record["state"] == "completed", record
    assert [a["reason"] for a in record["attempts"]] == ["worker_lost", None]
    assert [o["path"] for o in record["outputs"]] == ["a.txt"]


class CountingStore:
    """The store, counting the calls made to it by name."""

    def __init__(self, store: Store) -> None:
        self.store, self.calls = store, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        self.calls[name] += 1
        return getattr(self.store, name)


def test_only_a_job_claimed_again_reads_the_stages_of_its_earlier_attempts(api: Api) -> None:
    alice = api.tenant("alice")
    body = {"code": "print(1)", "retry": {"max_attempts": 2}}
    store = CountingStore(api.services.store)
    config = WorkerConfig("wrk_test", slots=1, lease_s=5, heartbeat_s=0.1, poll_s=0.01)
    worker = Worker(store, api.blobs, HostProcessRuntime(), FakeImages("python"), config)  # type: ignore[arg-type]
    for _ in range(2):
        api.http.post("/v1/jobs", json=body, headers=alice)
    first = api.services.store.claim_next("wrk_test", time.time(), 5)
    assert first is not None
    worker.run_job(first)
    assert store.calls["job_stages"] == 0  # a first claim: no earlier attempt to restore from
    lost = api.services.store.claim_next("wrk_gone", time.time(), 5)
    assert lost is not None and api.services.store.fail_lost_jobs(time.time() + 60) == [lost.id]
    again = api.services.store.claim_next("wrk_test", time.time(), 5)
    assert again is not None and again.id == lost.id
    worker.run_job(again)
    assert store.calls["job_stages"] == 1  # its earlier attempt may have committed stages
    record = api.http.get(f"/v1/jobs/{again.id}", headers=alice).json()
    assert record["state"] == "completed" and len(record["attempts"]) == 2
