"""Fault injection on a real scale-out deployment: API and workers as processes, PostgreSQL.

- kill -9 the worker of a staged job (CSV → clean → chart) after its stage and its once-block:
  with retry it completes on the other worker, the side effect happened once, the chart is
  right; the killed worker's sandbox outlives it until a worker restarts on that data dir;
- the same without retry: failed/worker_lost, and nothing of it left after the reaper;
- SIGTERM to a `sandcell worker` (not through serve) while a short job runs: the job completes
  within SANDCELL_DRAIN_S on that worker, which then exits cleanly;
- kill -9 the API right after it accepted a job: the same Idempotency-Key, on a new API
  process, gives the same job;
- restart PostgreSQL under a run of jobs: every job ends exactly once, none lost or doubled.
"""

import hashlib
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from sandcell.runtime.images import build_image
from tests.e2e.cluster import (
    Cluster,
    CountingServer,
    Proc,
    egress_env,
    fresh_schema,
    runtime_of,
    wait_for,
)
from tests.e2e.conftest import IMAGE_DIR, host_processes_mentioning

pytestmark = pytest.mark.gvisor
Json = dict[str, Any]
TERMINAL = ("completed", "failed", "cancelled")
RAW_CSV = b"city,temp\n Oslo ,4\nRome,18\nNowhere,\nLima,19\n"
# The chart: plain SVG bars (the python image has no matplotlib). Run here too, for the sha256.
CHART = """
def chart(rows):
    bars = "".join(
        f'<rect x="{i * 30}" y="{100 - int(t)}" width="20" height="{t}"><title>{c}</title></rect>'
        for i, (c, t) in enumerate(rows)
    )
    svg = '<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="100">{}</svg>'
    return svg.format(30 * len(rows), bars)
"""
STAGED_JOB = (
    """
import csv, os, time, urllib.request
import sandcell_guest as guest
"""
    + CHART
    + """
resumed = guest.completed_stages()
print("resumed after:", resumed, flush=True)
if "clean" not in resumed:
    rows = [r for r in csv.DictReader(open("/input/raw.csv")) if r["temp"].strip()]
    with open("/output/clean.csv", "w", newline="") as out:
        writer = csv.writer(out)
        writer.writerows([(r["city"].strip().lower(), int(r["temp"])) for r in rows])
    guest.commit_stage("clean", files=["clean.csv"])
with guest.once("notify"):
    request = urllib.request.Request("http://notify.test:PORT/notify", b"clean", method="POST")
    urllib.request.urlopen(request, timeout=20).read()
if not resumed:
    time.sleep(50)  # the first attempt's worker is killed here
rows = list(csv.reader(open("/output/clean.csv")))
open("/output/chart.svg", "w").write(chart(rows))
guest.commit_stage("chart", files=["chart.svg"])
"""
)


def _expected_chart() -> bytes:
    namespace: Json = {}
    exec(CHART, namespace)  # the job's own chart function, on the clean rows
    rows = [["oslo", "4"], ["rome", "18"], ["lima", "19"]]
    return str(namespace["chart"](rows)).encode()


@pytest.fixture(scope="module")
def notify() -> Iterator[CountingServer]:
    server = CountingServer()
    yield server
    server.close()


@pytest.fixture(scope="module")
def cluster(notify: CountingServer) -> Iterator[Cluster]:
    build_image("python", IMAGE_DIR)
    # Short: unix socket paths (the egress proxy's, under each data dir) fit in 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="sc-rec-", dir="/var/tmp"))
    base.chmod(0o711)
    with fresh_schema() as schema:
        deployment = Cluster(base, schema, egress_env({"notify.test": "127.0.0.1"}))
        try:
            deployment.start_api()
            deployment.start_worker("wa")
            deployment.start_worker("wb")
            yield deployment
        finally:
            deployment.close()
            shutil.rmtree(base, ignore_errors=True)


def _submit(http: httpx.Client, body: Json, key: str | None = None) -> str:
    headers = {"Idempotency-Key": key} if key else {}
    answer = http.post("/v1/jobs", json=body, headers=headers)
    assert answer.status_code in (200, 202), answer.text
    return str(answer.json()["id"])


def _record(http: httpx.Client, job_id: str, wait: float = 0) -> Json:
    return dict(http.get(f"/v1/jobs/{job_id}", params={"wait": wait}).raise_for_status().json())


def _final(http: httpx.Client, job_id: str, timeout_s: float = 60) -> Json:
    def terminal() -> Json | None:
        record = _record(http, job_id, wait=2)
        return record if record["state"] in TERMINAL else None

    return dict(wait_for(terminal, lambda: _record(http, job_id), timeout_s))


def _sandbox_of(attempt: Json) -> str:
    """The sandbox an attempt ran in, as the job record says: pooled (`pool-<image>-<hex>`)
    or cold (`<job>-<token>`); never guessed from the job id."""
    sandbox_id = attempt["sandbox_id"]
    assert isinstance(sandbox_id, str) and sandbox_id, attempt
    return sandbox_id


def _sandbox_left(proc: Proc, sandbox_id: str) -> list[str]:
    """Whatever of this sandbox the worker on `proc`'s data dir still has on the host."""
    runtime = runtime_of(proc)
    left = host_processes_mentioning(sandbox_id)
    left += [str(p) for p in runtime.sandboxes_dir.glob(sandbox_id)]
    for controller in ("memory", "pids"):
        cgroups = Path("/sys/fs/cgroup", controller, runtime.cgroup_parent)
        left += [str(p) for p in cgroups.glob(sandbox_id)]
    return left


def _restart(cluster: Cluster, killed: Proc) -> Proc:
    """A worker on the killed one's data dir: its start-up reaper removes what was left."""
    return cluster.start_worker(killed.name)


def _submit_staged(http: httpx.Client, notify: CountingServer, path: str, retry: Json) -> str:
    """The CSV → clean → chart job; its once-block POSTs to `path` on the counting server."""
    upload = http.post("/v1/files", files={"file": ("raw.csv", RAW_CSV)}).raise_for_status()
    body = {
        "code": STAGED_JOB.replace("PORT/notify", f"{notify.port}{path}"),
        "inputs": [{"file_id": upload.json()["id"], "path": "raw.csv"}],
        "network": {"allow": ["notify.test"]},
    } | ({"retry": retry} if retry else {})
    return _submit(http, body)


def _kill_after_stage(
    cluster: Cluster, http: httpx.Client, notify: CountingServer, job_id: str, path: str
) -> Proc:
    """kill -9 the job's worker once its stage is committed and its once-block has run."""
    staged = lambda: notify.counts.get(path) == 1 and _record(http, job_id)["stages"]  # noqa: E731
    wait_for(staged, lambda: (_record(http, job_id), notify.counts), 60)
    victim = cluster.worker_of(job_id)
    victim.kill9()
    return victim


def test_a_killed_workers_staged_job_completes_elsewhere_without_redoing_its_stage(
    cluster: Cluster, notify: CountingServer
) -> None:
    alice = cluster.tenant("alice")
    with cluster.http(alice) as http:
        job_id = _submit_staged(http, notify, "/notify", {"max_attempts": 2})
        victim = _kill_after_stage(cluster, http, notify, job_id, "/notify")

        record = _final(http, job_id)
        assert record["state"] == "completed", (record, victim.tail())
        assert notify.counts == {"/notify": 1}  # the once-block did not run again
        first, second = record["attempts"]
        assert (first["worker_id"], first["reason"]) == (victim.worker_id, "worker_lost")
        assert second["worker_id"] != victim.worker_id and second["state"] == "completed"
        stages = {s["name"]: s for s in record["stages"]}
        assert stages["clean"]["attempt"] == first["number"]  # committed once, by attempt 1
        assert stages["chart"]["attempt"] == second["number"]
        outputs = {o["path"]: o["sha256"] for o in record["outputs"]}
        clean = b"oslo,4\r\nrome,18\r\nlima,19\r\n"  # csv.writer's line ends
        assert outputs == {
            "clean.csv": hashlib.sha256(clean).hexdigest(),
            "chart.svg": hashlib.sha256(_expected_chart()).hexdigest(),
        }
        chart_id = next(o["artifact_id"] for o in record["outputs"] if o["path"] == "chart.svg")
        assert http.get(f"/v1/artifacts/{chart_id}/content").content == _expected_chart()

    # runsc outlives its killed parent; the next worker on that data dir reaps it at start.
    killed = _sandbox_of(first)
    assert _sandbox_left(victim, killed), "expected the killed worker's sandbox to survive"
    _restart(cluster, victim)
    assert _sandbox_left(victim, killed) == []


def test_without_retry_a_killed_workers_staged_job_fails_as_worker_lost(
    cluster: Cluster, notify: CountingServer
) -> None:
    bob = cluster.tenant("bob")
    with cluster.http(bob) as http:
        job_id = _submit_staged(http, notify, "/notify-once", {})
        victim = _kill_after_stage(cluster, http, notify, job_id, "/notify-once")
        record = _final(http, job_id, timeout_s=30)
    assert (record["state"], record["reason"]) == ("failed", "worker_lost"), record
    assert [a["reason"] for a in record["attempts"]] == ["worker_lost"]
    assert [s["name"] for s in record["stages"]] == ["clean"]  # kept, never resumed: no retry
    assert notify.counts["/notify-once"] == 1
    killed = _sandbox_of(record["attempts"][0])
    # runsc and the job's sandbox outlive a kill -9 of their worker (runsc daemonises): what
    # guarantees that none of the job's processes is left is the start-up reaper of the next
    # worker on that data dir, so the check is made after that restart.
    assert _sandbox_left(victim, killed), "expected the killed worker's sandbox to survive"
    _restart(cluster, victim)
    assert _sandbox_left(victim, killed) == []
    assert host_processes_mentioning(killed) == host_processes_mentioning(job_id) == []


def test_sigterm_to_a_worker_lets_its_running_job_complete_within_the_drain_time(
    cluster: Cluster,
) -> None:
    drain_s = float(cluster.env(cluster.base)["SANDCELL_DRAIN_S"])
    erin = cluster.tenant("erin")
    code = "print('up', flush=True)\nimport time; time.sleep(1)\nopen('/output/done','w')"
    with cluster.http(erin) as http:
        job_id = _submit(http, {"code": code})
        wait_for(lambda: _record(http, job_id)["started_at"], lambda: _record(http, job_id), 60)
        worker = cluster.worker_of(job_id)
        signalled = time.time()
        worker.popen.send_signal(signal.SIGTERM)
        worker.popen.wait(drain_s + 15)  # the drain, then closing its pools and sessions
        record = _final(http, job_id, timeout_s=10)
    assert worker.popen.returncode == 0, worker.tail()
    assert record["state"] == "completed", (record, worker.tail())
    finished = datetime.fromisoformat(record["finished_at"]).timestamp()
    assert signalled < finished <= signalled + drain_s  # it finished while the worker drained
    [attempt] = record["attempts"]  # not handed back, not run again
    assert attempt["worker_id"] == worker.worker_id and attempt["state"] == "completed"
    assert [o["path"] for o in record["outputs"]] == ["done"]
    _restart(cluster, worker)  # the module's later tests expect two workers


def test_the_same_idempotency_key_after_an_api_crash_gives_the_same_job(cluster: Cluster) -> None:
    carol = cluster.tenant("carol")
    body = {"code": "print('once')"}
    key = f"crash-{uuid.uuid4()}"
    with cluster.http(carol) as http:
        first = http.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    assert first.status_code == 202, first.text
    assert cluster.api is not None
    cluster.api.kill9()  # the answer is in; whatever the API held in memory is gone
    cluster.start_api("api-2")
    with cluster.http(carol) as http:
        again = http.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
        assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])
        listed = http.get("/v1/jobs").raise_for_status().json()["items"]
        assert [job["id"] for job in listed] == [first.json()["id"]]
        assert _final(http, first.json()["id"])["state"] == "completed"


def _submit_through_outages(
    http: httpx.Client, body: Json, key: str, refusals: list[int] | None = None
) -> str:
    """A careful client: on 503 or a dropped connection, the same request, the same key."""
    deadline = time.monotonic() + 60
    while True:
        try:
            answer = http.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
            if answer.status_code in (200, 202):
                return str(answer.json()["id"])
            assert answer.status_code == 503 and answer.headers["Retry-After"], answer.text
            (refusals if refusals is not None else []).append(answer.status_code)
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, f"could not submit {key}"
        time.sleep(0.2)


def _pg_ctl(action: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", action],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _bounce_postgres(down_s: float) -> None:
    """A restart with a sure outage: stopped for `down_s` (a plain restart can be too quick
    for anyone to notice)."""
    _pg_ctl("stop")
    time.sleep(down_s)
    _pg_ctl("start")


def _postgres_down() -> bool:
    try:
        psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", connect_timeout=1).close()
    except psycopg.OperationalError:
        return True
    return False


def test_every_job_ends_exactly_once_across_a_database_restart(cluster: Cluster) -> None:
    jobs_n = 200  # as the issue asks; about a minute on 2 cores
    dave = cluster.tenant("dave")
    body = {"code": "print(1)", "retry": {"max_attempts": 3}}
    keys = [f"pg-{i}-{uuid.uuid4()}" for i in range(jobs_n)]
    refusals: list[int] = []
    with cluster.http(dave) as http:
        ids = [_submit_through_outages(http, body, key) for key in keys[: jobs_n // 2]]
        wait_for(lambda: _record(http, ids[3])["state"] in TERMINAL, lambda: "no progress", 60)
        outage = threading.Thread(target=_bounce_postgres, args=(2.0,))
        outage.start()
        wait_for(_postgres_down, lambda: "postgres did not stop", 30)
        # Submitted into the outage: refused (503), then retried with the same keys.
        ids += [_submit_through_outages(http, body, k, refusals) for k in keys[jobs_n // 2 :]]
        outage.join()
        records = [_final_through_outages(http, job_id) for job_id in ids]
        listed = _all_jobs(http)
    assert refusals, "the outage was not seen by the API"
    assert len(set(ids)) == jobs_n and sorted(listed) == sorted(ids)  # none lost, none doubled
    for record in records:
        assert record["state"] in TERMINAL and record["finished_at"], record
        assert record["attempts"][-1]["state"] == record["state"], record  # decided once
        assert all(a["reason"] == "worker_lost" for a in record["attempts"][:-1]), record
    failed = [(r["id"], r["reason"], r["detail"], r["attempts"]) for r in records]
    assert all(r["state"] == "completed" for r in records), [f for f in failed if f[1]]
    workers = [p for p in cluster.procs if p.worker_id and p.popen.returncode is None]
    assert all(p.popen.poll() is None for p in workers)  # the outage ended no worker
    assert all("store unavailable" in p.log.read_text() for p in workers)  # but they saw it


def _final_through_outages(http: httpx.Client, job_id: str) -> Json:
    def terminal() -> Json | None:
        try:
            record = _record(http, job_id, wait=2)
        except httpx.HTTPError:
            return None
        return record if record["state"] in TERMINAL else None

    return dict(wait_for(terminal, lambda: job_id, 120))


def _all_jobs(http: httpx.Client) -> list[str]:
    ids, cursor = [], None
    while True:
        params = {"limit": 200} | ({"cursor": cursor} if cursor else {})
        page = http.get("/v1/jobs", params=params).raise_for_status().json()
        ids += [job["id"] for job in page["items"]]
        if not (cursor := page["next_cursor"]):
            return ids
