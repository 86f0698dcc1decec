"""Warm pool rules that need no sandbox: sizes, what goes cold, and `pooled` on the record."""

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandcell.domain.images import Image
from sandcell.domain.limits import Limits
from sandcell.ports.egress import EgressAttachment
from sandcell.ports.runtime import InputFile, SandboxResult, SandboxSink, SandboxSpec
from sandcell.runtime.pool import pool_refusal
from sandcell.services.worker import Worker, WorkerConfig
from sandcell.settings import Settings, parse_pool_sizes
from tests.conftest import Api
from tests.fakes import FakeImages, HostProcessRuntime

IMAGE = Image("python", "1", "sha256:0", Path("/nonexistent"))
SPEC = SandboxSpec("s", IMAGE, [IMAGE.python, "/job/main.py"], {}, Limits(), code=b"print(1)")


def test_sizes_parse_and_reject_malformed_entries() -> None:
    assert parse_pool_sizes("python=2, python-data=1,") == {"python": 2, "python-data": 1}
    assert parse_pool_sizes("") == parse_pool_sizes("0") == {}  # as the settings say: no pool
    for bad in ("python", "python=x", "=2", "python=-1", "0,python=1"):
        with pytest.raises(ValueError):
            parse_pool_sizes(bad)
        with pytest.raises(ValidationError, match="is not IMAGE=COUNT"):
            Settings(session_pool_size=bad)


def test_default_jobs_fit_the_pool_and_tighter_memory_too() -> None:
    assert pool_refusal(SPEC, Limits()) is None
    env = {"PYTHONPATH": "/x", "PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8", "TZ": "UTC", "A": "b"}
    assert pool_refusal(replace(SPEC, env=env), Limits()) is None  # applied at hand-over
    tighter = Limits(memory_mb=64, cpu=0.5, timeout_s=5, output_mb=1)
    assert pool_refusal(replace(SPEC, limits=tighter), Limits()) is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"limits": Limits(pids=64)}, "pids"),
        ({"limits": Limits(disk_mb=64)}, "disk_mb"),
        ({"limits": Limits(memory_mb=1024)}, "memory_mb"),
        ({"egress": EgressAttachment(Path("/s"), Path("/ca"))}, "network"),
        ({"restore_outputs": [InputFile(Path("/x"), "x")]}, "restored outputs"),
        ({"argv": ["/bin/sh", "-c", "true"], "code": None}, "command"),
        ({"env": {"PYTHONHASHSEED": "0"}}, "env"),  # read only as python starts
        ({"env": {"PYTHONWARNINGS": "error"}}, "env"),
        ({"env": {"LC_ALL": "C"}}, "env"),
        ({"env": {"MPLBACKEND": "svg"}}, "env"),  # matplotlib was imported with Agg
    ],
)
def test_what_the_pool_cannot_honour_goes_cold(change: dict[str, object], why: str) -> None:
    assert pool_refusal(replace(SPEC, **change), Limits()) == why  # type: ignore[arg-type]


class PooledHostRuntime(HostProcessRuntime):
    def run(self, spec: SandboxSpec, sink: SandboxSink, cancel: threading.Event) -> SandboxResult:
        result = super().run(spec, sink, cancel)
        result.pooled = "cold" not in (spec.code or b"").decode()
        return result


def test_the_job_record_says_whether_it_came_from_the_pool(api: Api) -> None:
    alice = api.tenant("alice")
    warm = api.http.post("/v1/jobs", json={"code": "print(1)"}, headers=alice).json()
    cold = api.http.post("/v1/jobs", json={"code": "print('cold')"}, headers=alice).json()
    assert warm["pooled"] is False  # not run yet
    config = WorkerConfig("wrk_test", slots=1, lease_s=5, heartbeat_s=0.1, poll_s=0.01)
    store = api.services.store
    worker = Worker(store, api.blobs, PooledHostRuntime(), FakeImages("python"), config)
    while (job := store.claim_next("wrk_test", time.time(), 5)) is not None:
        worker.run_job(job)
    got = {j["id"]: api.http.get(f"/v1/jobs/{j['id']}", headers=alice).json() for j in (warm, cold)}
    assert got[warm["id"]]["state"] == "completed" and got[warm["id"]]["pooled"] is True
    assert got[cold["id"]]["state"] == "completed" and got[cold["id"]]["pooled"] is False
