"""The guest channel and the sandcell_guest helper, end to end on the host (no sandbox)."""

import hashlib
import time
from pathlib import Path

import pytest

from sandcell.domain.errors import StaleLease
from sandcell.domain.states import Reason
from sandcell.guest import sandcell_guest
from sandcell.remote.guest_channel import GuestChannel
from sandcell.services.stages import StageRecorder, restored_outputs
from tests.conftest import Api


@pytest.fixture
def channel(api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    alice = api.tenant("alice")
    job = api.http.post("/v1/jobs", json={"code": "1"}, headers=alice).json()
    claimed = api.services.store.claim_next("wrk", time.time(), 30)
    assert claimed is not None and claimed.id == job["id"]
    recorder = StageRecorder(api.services.store, api.blobs, claimed, claimed.fencing_token)
    output = tmp_path / "output"
    output.mkdir()
    chan = GuestChannel(tmp_path / "chan", recorder)
    chan.start()
    monkeypatch.setattr(sandcell_guest, "SOCKET", str(tmp_path / "chan" / "guest.sock"))
    monkeypatch.setattr(sandcell_guest, "OUTPUT", str(output))
    monkeypatch.setattr(sandcell_guest, "_committed", [])
    yield claimed, output
    chan.close()


def test_commit_stage_stores_files_and_records_the_stage(api: Api, channel) -> None:
    job, output = channel
    (output / "clean.csv").write_bytes(b"a,b\n1,2\n")
    [stored] = sandcell_guest.commit_stage("clean", files=["clean.csv"])
    assert stored["sha256"] == hashlib.sha256(b"a,b\n1,2\n").hexdigest()
    [stage] = api.services.store.job_stages(job.id)
    assert stage["name"] == "clean" and stage["files"][0]["path"] == "clean.csv"
    assert sandcell_guest.completed_stages() == ["clean"]
    [restored] = restored_outputs(api.services.store, api.blobs, job)
    assert restored.guest_path == "clean.csv" and restored.host_path.read_bytes() == b"a,b\n1,2\n"
    with pytest.raises(sandcell_guest.ChannelError):
        sandcell_guest.commit_stage("clean", files=["clean.csv"])  # a stage commits once
    with pytest.raises(ValueError):
        sandcell_guest.commit_stage("escape", files=["../etc/passwd"])


def test_once_runs_a_block_the_first_time_only(channel) -> None:
    ran = []
    for _ in range(3):
        with sandcell_guest.once("notify"):
            ran.append("notified")
        ran.append("after")
    assert ran == ["notified", "after", "after", "after"]


def test_a_tampered_stage_file_fails_its_checksum_on_restore(api: Api, channel) -> None:
    job, output = channel
    (output / "x.bin").write_bytes(b"original")
    [stored] = sandcell_guest.commit_stage("s", files=["x.bin"])
    api.blobs.path(stored["sha256"]).write_bytes(b"tampered")
    with pytest.raises(Exception, match="checksum"):
        restored_outputs(api.services.store, api.blobs, job)


def test_a_stale_attempt_cannot_commit(api: Api, channel) -> None:
    job, output = channel
    api.services.store.fail_job(job.id, Reason.WORKER_LOST, "lost", time.time())
    (output / "late.txt").write_bytes(b"late")
    with pytest.raises(sandcell_guest.ChannelError):
        sandcell_guest.commit_stage("late", files=["late.txt"])
    with pytest.raises(StaleLease):
        api.services.store.record_once(job.id, job.fencing_token, "k", time.time())
