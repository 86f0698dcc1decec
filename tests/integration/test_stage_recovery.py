"""Stages and once-blocks through the real worker, guest channel and gVisor (one process).

The first attempt commits a stage and runs a once-block, then "loses" its worker: its lease is
expired through the store, as another worker's housekeeping would. The second attempt must
find the stage's file back in /output, SANDCELL_COMPLETED_STAGES set, and the block skipped.
"""

import hashlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandcell.domain.images import Image
from sandcell.remote.guest_channel import SocketGuestChannels
from sandcell.runtime.gvisor import GVisorRuntime
from sandcell.runtime.images import FilesystemImageCatalog
from sandcell.services.worker import Worker, WorkerConfig
from tests.conftest import Api
from tests.integration.conftest import IMAGE_DIR

pytestmark = pytest.mark.gvisor
LEASE_S = 4  # the heartbeat renews (and finds the lease lost) at half of it

CLEAN = b"city,temp\noslo,4\nrome,18\n"
STAGED_JOB = f"""
import os, time
import sandcell_guest as guest

print("completed:", os.environ["SANDCELL_COMPLETED_STAGES"], guest.completed_stages())
if "clean" not in guest.completed_stages():
    open("/output/clean.csv", "wb").write({CLEAN!r})
    guest.commit_stage("clean", files=["clean.csv"])
print("restored:", open("/output/clean.csv", "rb").read() == {CLEAN!r})
with guest.once("notify"):
    print("notified")
if not os.environ["SANDCELL_COMPLETED_STAGES"]:
    time.sleep(50)  # the first attempt's worker is lost here
open("/output/chart.svg", "w").write("<svg/>")
"""


@pytest.fixture
def worker(api: Api, gvisor: GVisorRuntime, python_image: Image) -> Worker:
    config = WorkerConfig("wrk_stages", slots=1, lease_s=LEASE_S, heartbeat_s=0.1)
    images = FilesystemImageCatalog(IMAGE_DIR)
    channels = SocketGuestChannels(api.tmp / "channels")
    return Worker(api.services.store, api.blobs, gvisor, images, config, channels=channels)


def _wait_for(
    check: Callable[[], bool], explain: Callable[[], object], timeout_s: float = 60
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, explain()
        time.sleep(0.05)


def test_a_retry_resumes_after_the_committed_stage(api: Api, worker: Worker) -> None:
    alice = api.tenant("alice")
    body = {"code": STAGED_JOB, "retry": {"max_attempts": 2}}
    job_id = api.http.post("/v1/jobs", json=body, headers=alice).json()["id"]
    store = api.services.store

    first = store.claim_next("wrk_stages", time.time(), LEASE_S)
    assert first is not None and first.id == job_id
    runner = threading.Thread(target=worker._run_guarded, args=(first,))  # as the pool runs it
    runner.start()
    _wait_for(
        lambda: bool(store.job_stages(job_id)) and store.once_keys(job_id) == ["notify"],
        lambda: (store.get_job(None, job_id), store.read_logs(job_id, -1)),
    )
    assert store.fail_lost_jobs(time.time() + 3600) == [job_id]  # its lease ran out
    runner.join(30)  # the heartbeat sees the lost lease and stops the sandbox
    assert not runner.is_alive()

    second = store.claim_next("wrk_stages", time.time(), LEASE_S)
    assert second is not None and second.fencing_token > first.fencing_token
    worker.run_job(second)

    record = api.http.get(f"/v1/jobs/{job_id}", headers=alice).json()
    assert record["state"] == "completed", record
    assert [a["reason"] for a in record["attempts"]] == ["worker_lost", None]
    [stage] = store.job_stages(job_id)
    assert stage["name"] == "clean" and stage["attempt"] == first.fencing_token
    assert stage["files"][0]["sha256"] == hashlib.sha256(CLEAN).hexdigest()
    stdout = api.http.get(f"/v1/jobs/{job_id}/logs", headers=alice).json()["stdout"]
    # The first attempt's output died with it (unflushed); the second's says it all.
    assert stdout == "completed: clean ['clean']\nrestored: True\n"  # and no "notified"
    assert store.once_keys(job_id) == ["notify"]
    outputs = {o["path"]: o["sha256"] for o in record["outputs"]}
    assert outputs == {
        "clean.csv": hashlib.sha256(CLEAN).hexdigest(),
        "chart.svg": hashlib.sha256(b"<svg/>").hexdigest(),
    }
    assert not list(Path(api.tmp / "channels").iterdir())  # each attempt's socket is gone
