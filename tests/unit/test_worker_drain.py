"""Draining and stopping a worker through the admin API, with the host-process fake runtime.

The request travels as the real one does: an admin call writes it to the store, the worker
reads it when it reports in, and `serve` ends with the mode it was asked for.
"""

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandcell.domain.workers import StopMode
from sandcell.remote.guest_channel import SocketGuestChannels
from sandcell.services.worker import Worker, WorkerConfig
from tests.conftest import ADMIN_KEY, Api
from tests.fakes import FakeImages, HostProcessRuntime

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


class Running:
    def __init__(
        self, api: Api, worker_id: str, channels: SocketGuestChannels | None = None
    ) -> None:
        config = WorkerConfig(worker_id, slots=2, lease_s=5, heartbeat_s=0.1, poll_s=0.02)
        self.worker = Worker(
            api.services.store,
            api.blobs,
            HostProcessRuntime(),
            FakeImages("python"),
            config,
            channels=channels,
        )
        self.stop = threading.Event()
        self.ended: list[StopMode | None] = []
        self.thread = threading.Thread(
            target=lambda: self.ended.append(self.worker.serve(self.stop))
        )
        self.thread.start()

    def join(self, timeout_s: float) -> StopMode | None:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the worker did not end"
        return self.ended[0]


@pytest.fixture
def running(api: Api) -> Iterator[Callable[[str], Running]]:
    started: list[Running] = []

    def start(worker_id: str) -> Running:
        started.append(Running(api, worker_id))
        _wait(lambda: _listed(api, worker_id))
        return started[-1]

    yield start
    for each in started:
        each.stop.set()
        each.thread.join(30)


def _wait(check: Callable[[], Any], timeout_s: float = 20) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


def _listed(api: Api, worker_id: str) -> dict[str, Any] | None:
    page = api.http.get("/v1/admin/workers", headers=ADMIN).json()
    return next((w for w in page["items"] if w["id"] == worker_id), None)


def _job(api: Api, who: dict[str, str], job_id: str) -> dict[str, Any]:
    return dict(api.http.get(f"/v1/jobs/{job_id}", headers=who).json())


def _terminal(record: dict[str, Any]) -> dict[str, Any] | None:
    return record if record["state"] in ("completed", "failed", "cancelled") else None


def _holding(api: Api, worker_id: str, job_id: str) -> bool:
    worker = _listed(api, worker_id)
    return worker is not None and job_id in worker["running_jobs"]


def test_drain_finishes_the_running_job_claims_nothing_new_and_ends(
    api: Api, running: Callable[[str], Running]
) -> None:
    alice = api.tenant("alice")
    worker = running("wrk_drain")
    slow = api.http.post(
        "/v1/jobs", json={"code": "import time; time.sleep(2); print('done')"}, headers=alice
    ).json()
    _wait(lambda: _holding(api, "wrk_drain", slow["id"]))
    answer = api.http.post("/v1/admin/workers/wrk_drain/drain", json={}, headers=ADMIN)
    assert answer.status_code == 202 and answer.json()["state"] == "draining", answer.text
    _wait(lambda: worker.worker.stop_mode is StopMode.DRAIN)
    later = api.http.post("/v1/jobs", json={"code": "print(2)"}, headers=alice).json()

    assert worker.join(30) is StopMode.DRAIN
    record = _job(api, alice, slow["id"])
    assert (record["state"], record["usage"]["released"]) == ("completed", 1.0), record
    assert _job(api, alice, later["id"])["state"] == "accepted"  # a draining worker claims none
    stopped = api.http.get("/v1/admin/workers/wrk_drain", headers=ADMIN).json()
    assert stopped["state"] == "stopped" and stopped["stopped_at"]
    assert _listed(api, "wrk_drain") is None  # gone from the default listing


def test_stop_hands_the_job_back_and_a_new_worker_finishes_it(
    api: Api, running: Callable[[str], Running]
) -> None:
    alice = api.tenant("alice")
    first = running("wrk_first")
    job = api.http.post(
        "/v1/jobs",
        json={
            "code": "import time; time.sleep(30)",
            "retry": {"max_attempts": 2},
            "limits": {"timeout_s": 60},
        },
        headers=alice,
    ).json()
    _wait(lambda: _holding(api, "wrk_first", job["id"]))
    began = time.monotonic()
    body = {"mode": "stop"}
    answer = api.http.post("/v1/admin/workers/wrk_first/drain", json=body, headers=ADMIN)
    assert answer.status_code == 202 and answer.json()["state"] == "stopping", answer.text
    assert first.join(20) is StopMode.STOP
    assert time.monotonic() - began < 10  # stopped now, not after the job's 30 s

    handed_back = _job(api, alice, job["id"])
    assert handed_back["state"] == "accepted", handed_back
    [lost] = handed_back["attempts"]
    assert (lost["worker_id"], lost["reason"]) == ("wrk_first", "worker_lost")
    events = api.http.get("/v1/admin/audit", params={"action": "worker.stop"}, headers=ADMIN)
    assert [e["target"] for e in events.json()["items"]] == ["wrk_first"]


def test_a_second_attempt_on_a_fresh_worker_completes(
    api: Api, running: Callable[[str], Running], tmp_path: Path
) -> None:
    alice = api.tenant("alice")
    first = running("wrk_one")
    # The first attempt outlasts any stop (a loaded machine once let a 1 s job finish before
    # the stop was noticed); the second finds the mark and ends at once.
    mark = tmp_path / "first-attempt"
    code = (
        f"import os, time, pathlib; m = pathlib.Path({str(mark)!r})\n"
        "if not m.exists(): m.touch(); time.sleep(60)"
    )
    job = api.http.post(
        "/v1/jobs", json={"code": code, "retry": {"max_attempts": 2}}, headers=alice
    ).json()
    _wait(lambda: _holding(api, "wrk_one", job["id"]))
    api.http.post("/v1/admin/workers/wrk_one/drain", json={"mode": "stop"}, headers=ADMIN)
    assert first.join(20) is StopMode.STOP
    running("wrk_two")
    done = _wait(lambda: _terminal(_job(api, alice, job["id"])))
    assert done["state"] == "completed", done
    assert [a["worker_id"] for a in done["attempts"]] == ["wrk_one", "wrk_two"]


def test_drain_requests_are_checked_and_audited(
    api: Api, running: Callable[[str], Running]
) -> None:
    alice = api.tenant("alice")
    running("wrk_x")
    url = "/v1/admin/workers/wrk_x/drain"
    assert api.http.post(url, json={}, headers=alice).status_code == 403
    unknown = api.http.post("/v1/admin/workers/wrk_nope/drain", json={}, headers=ADMIN)
    assert unknown.status_code == 404
    assert unknown.headers["content-type"] == "application/problem+json"
    bad = api.http.post(url, json={"mode": "pause"}, headers=ADMIN)
    assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json"
    assert api.http.post(url, json={"mode": "drain"}, headers=ADMIN).status_code == 202
    assert api.http.post(url, json={"mode": "drain"}, headers=ADMIN).status_code == 202  # again
    assert api.http.post(url, json={"mode": "stop"}, headers=ADMIN).json()["state"] == "stopping"
    softer = api.http.post(url, json={"mode": "drain"}, headers=ADMIN)
    assert softer.status_code == 409, softer.text  # a stop is never softened into a drain
    audit = api.http.get("/v1/admin/audit", headers=ADMIN).json()["items"]
    mine = [(e["action"], e["target"], e["outcome"]) for e in audit if "worker" in e["action"]]
    assert ("worker.drain", "wrk_nope", "denied") in mine
    assert ("worker.stop", "wrk_x", "ok") in mine
    assert ("worker.drain", "wrk_x", "denied") in mine


def test_a_stopped_worker_leaves_no_channel_directory(api: Api, tmp_path: Path) -> None:
    channels = SocketGuestChannels(tmp_path / "channels")
    worker = Running(api, "wrk_tidy", channels)
    alice = api.tenant("alice")
    job = api.http.post("/v1/jobs?wait=20", json={"code": "print(1)"}, headers=alice).json()
    assert job["state"] == "completed", job
    assert channels.root.is_dir()
    worker.stop.set()
    assert worker.join(30) is None  # a signal's stop, not an operator's
    assert not channels.root.exists()
