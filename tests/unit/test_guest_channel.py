"""The guest channel and the sandcell_guest helper, end to end on the host (no sandbox)."""

import errno
import hashlib
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from sandcell.domain.errors import CorruptArtifact, StaleLease
from sandcell.domain.records import Job
from sandcell.domain.states import Reason
from sandcell.guest import sandcell_guest
from sandcell.ports.artifacts import BlobStore
from sandcell.remote.guest_channel import GuestChannel
from sandcell.services.stages import StageRecorder, restored_outputs
from tests.conftest import Api


class FillingBlobs:
    """A blob store with `room` bytes left: a put past it fails with ENOSPC, as a full disk
    does, after reading only what fit (the rest of a guest's file stays unread)."""

    def __init__(self, blobs: BlobStore, room: int) -> None:
        self.blobs, self.room = blobs, room

    def put(self, content: BinaryIO, max_bytes: int | None = None) -> tuple[str, int]:
        data = content.read(self.room + 1)
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(data)
        return self.blobs.put(io.BytesIO(data), max_bytes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.blobs, name)


def _claimed(api: Api) -> Job:
    alice = api.tenant(f"t{time.monotonic_ns()}")
    job = api.http.post("/v1/jobs", json={"code": "1"}, headers=alice).json()
    claimed = api.services.store.claim_next("wrk", time.time(), 30)
    assert claimed is not None and claimed.id == job["id"]
    return claimed


def _serve(recorder: StageRecorder, directory: Path) -> GuestChannel:
    chan = GuestChannel(directory, recorder)
    chan.start()
    return chan


@pytest.fixture
def recorder(api: Api) -> StageRecorder:
    claimed = _claimed(api)
    return StageRecorder(api.services.store, api.blobs, claimed, claimed.fencing_token)


@pytest.fixture
def channel(
    recorder: StageRecorder, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Job, Path]]:
    output = tmp_path / "output"
    output.mkdir()
    chan = _serve(recorder, tmp_path / "chan")
    monkeypatch.setattr(sandcell_guest, "SOCKET", str(tmp_path / "chan" / "guest.sock"))
    monkeypatch.setattr(sandcell_guest, "OUTPUT", str(output))
    monkeypatch.setattr(sandcell_guest, "_committed", [])
    yield recorder.job, output
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
    with pytest.raises(CorruptArtifact, match=r"^stage s output x\.bin failed its checksum"):
        restored_outputs(api.services.store, api.blobs, job)
    api.blobs.delete(stored["sha256"])
    with pytest.raises(CorruptArtifact, match=r"^stage s output x\.bin is missing from artifact"):
        restored_outputs(api.services.store, api.blobs, job)


def test_a_stale_attempt_cannot_commit(api: Api, channel) -> None:
    job, output = channel
    api.services.store.fail_job(job.id, Reason.WORKER_LOST, "lost", time.time())
    (output / "late.txt").write_bytes(b"late")
    with pytest.raises(sandcell_guest.ChannelError):
        sandcell_guest.commit_stage("late", files=["late.txt"])
    with pytest.raises(StaleLease):
        api.services.store.record_once(job.id, job.fencing_token, "k", time.time())


@pytest.mark.parametrize("second_size", [100, 3 << 20], ids=["small", "bigger-than-a-buffer"])
def test_a_full_disk_refuses_the_whole_stage_and_leaves_nothing(
    api: Api, recorder: StageRecorder, channel: tuple[Job, Path], second_size: int
) -> None:
    job, output = channel
    recorder.blobs = FillingBlobs(api.blobs, room=50)
    (output / "a.csv").write_bytes(b"a" * 10)  # fits
    (output / "b.bin").write_bytes(b"b" * second_size)  # does not: refused part way
    with pytest.raises(sandcell_guest.ChannelError, match=r"^artifact storage is full: stage"):
        sandcell_guest.commit_stage("clean", files=["a.csv", "b.bin"])
    store = api.services.store
    assert store.job_stages(job.id) == [] and store.list_artifacts(job.id) == []
    assert not api.blobs.exists(hashlib.sha256(b"a" * 10).hexdigest())  # what fit is gone too
    assert list((api.tmp / "blobs" / "tmp").iterdir()) == []
    assert recorder.storage_full is not None and "b.bin" in recorder.storage_full.detail
    assert sandcell_guest.completed_stages() == []
    recorder.blobs = api.blobs  # room again: the same stage commits whole
    assert len(sandcell_guest.commit_stage("clean", files=["a.csv", "b.bin"])) == 2


def _ask(socket_path: Path, request: dict[str, object], payload: bytes = b"") -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(socket_path))
        conn.sendall(json.dumps(request).encode() + b"\n" + payload)
        return dict(json.loads(conn.makefile("rb").readline()))


def test_a_request_naming_another_job_or_any_extra_field_is_refused(
    api: Api, tmp_path: Path
) -> None:
    mine, other = _claimed(api), _claimed(api)
    store = api.services.store
    chan = _serve(StageRecorder(store, api.blobs, mine, mine.fencing_token), tmp_path / "mine")
    sock = tmp_path / "mine" / "guest.sock"
    try:
        hostile: list[tuple[dict[str, object], bytes]] = [
            ({"op": "once", "key": "k", "job_id": other.id}, b""),
            ({"op": "once", "key": "k", "token": other.fencing_token}, b""),
            ({"op": "completed_stages", "job": other.id}, b""),
            ({"op": "commit_stage", "name": "s", "files": [], "tenant_id": other.tenant_id}, b""),
            (
                {
                    "op": "commit_stage",
                    "name": "s",
                    "files": [{"path": "x", "size": 1, "job_id": other.id}],
                },
                b"x",
            ),
            ({"op": "commit_stage", "name": "s", "files": ["x"]}, b""),
            ({"op": "delete_job", "job_id": other.id}, b""),
        ]
        for request, payload in hostile:
            answer = _ask(sock, request, payload)
            assert answer["ok"] is False, (request, answer)
        assert _ask(sock, {"op": "once", "key": "k"}) == {"ok": True, "run": True}
    finally:
        chan.close()
    assert store.once_keys(mine.id) == ["k"]  # only the well-formed request, on its own job
    assert store.once_keys(other.id) == [] and store.job_stages(other.id) == []
    assert store.job_stages(mine.id) == [] and store.list_artifacts(other.id) == []


def test_closing_a_channel_ends_its_threads(recorder: StageRecorder, tmp_path: Path) -> None:
    """A worker makes one channel a job: a thread left blocked in accept() was one more thread
    for every job the worker had run. One thread accepts for every channel of the process."""
    before = set(threading.enumerate())
    for n in range(3):
        chan = _serve(recorder, tmp_path / f"chan{n}")
        with socket.socket(socket.AF_UNIX) as guest:  # a connection, served by its own thread
            guest.connect(str(tmp_path / f"chan{n}" / "guest.sock"))
            guest.sendall(json.dumps({"op": "once", "key": f"k{n}"}).encode() + b"\n")
            assert json.loads(guest.makefile().readline())["ok"]
        chan.close()
        assert not (tmp_path / f"chan{n}").exists()
    left = {thread.name for thread in set(threading.enumerate()) - before}
    assert left <= {"guest-channels"}
