"""Step 4: a staged job commits an intermediate artifact, its worker is stopped through the
admin lifecycle (`POST /v1/admin/workers/{id}/drain {"mode": "stop"}`), and the job resumes
from the committed stage with the checksum verified; its `once` action is not repeated."""

import hashlib
import time
from typing import Any

from sandcell.acceptance.checks import StepFailed, StepResult
from sandcell.acceptance.deployment import Deployment, JobEntry, Tenant
from sandcell.acceptance.endpoints import LoopbackEndpoint

RAW = b"city,temp\n Oslo ,4\nRome,18\nNowhere,\nLima,19\n"
CLEAN = b"oslo,4\nrome,18\nlima,19\n"
SUMMARY = b"3 cities, mean 13.67\n"
PROGRAM = """
import time, urllib.request
import sandcell_guest as guest
resumed = guest.completed_stages()
print("resumed after:", resumed, flush=True)
if "clean" not in resumed:
    rows = [l.split(",") for l in open("/input/raw.csv").read().splitlines()[1:]]
    rows = [(c.strip().lower(), t) for c, t in rows if t.strip()]
    open("/output/clean.csv", "w").write("".join(f"{c},{t}\\n" for c, t in rows))
    guest.commit_stage("clean", files=["clean.csv"])
with guest.once("notify"):
    urllib.request.urlopen(urllib.request.Request(NOTIFY, b"clean", method="POST"), timeout=20)
if not resumed:
    print("waiting to be stopped", flush=True)
    time.sleep(300)
temps = [int(l.split(",")[1]) for l in open("/output/clean.csv").read().splitlines()]
mean = sum(temps) / len(temps)
open("/output/summary.txt", "w").write(f"{len(temps)} cities, mean {mean:.2f}\\n")
guest.commit_stage("summary", files=["summary.txt"])
"""


def run(deployment: Deployment, step: StepResult, shared: dict[str, Any]) -> None:
    tenant: Tenant = shared.get("tenants", [None])[0] or deployment.tenant("recovery")
    notify = LoopbackEndpoint("127.0.0.1")
    try:
        entry = _submit(deployment, tenant, notify)
        _wait(lambda: notify.hits["/notify"] == 1 and _staged(deployment, entry), 120, entry)
        worker = _stop_the_worker_of(deployment, step, entry)
        record = deployment.finish(entry, timeout_s=240)
        _resumed(deployment, step, entry, record, worker, notify)
    finally:
        notify.close()
    _a_worker_is_back(deployment, step)


def _submit(deployment: Deployment, tenant: Tenant, notify: LoopbackEndpoint) -> JobEntry:
    stored = deployment.upload(tenant, "raw.csv", RAW)
    body = {
        "code": PROGRAM.replace("NOTIFY", repr(notify.url("/notify"))),
        "inputs": [{"file_id": stored["id"], "path": "raw.csv"}],
        "network": {"allow": [notify.address]},
        "retry": {"max_attempts": 2},
        "limits": {"timeout_s": 600},
    }
    return deployment.submit(tenant, body, step=4)


def _staged(deployment: Deployment, entry: JobEntry) -> bool:
    record = deployment.record(entry)
    if record["state"] in ("completed", "failed", "cancelled"):
        raise StepFailed(f"the staged job ended before its worker was stopped: {record}")
    return any(stage["name"] == "clean" for stage in record.get("stages", []))


def _wait(check: Any, timeout_s: float, entry: JobEntry) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise StepFailed(f"job {entry.id}: not staged after {timeout_s:.0f} s: {entry.record}")
        time.sleep(0.2)


def _stop_the_worker_of(deployment: Deployment, step: StepResult, entry: JobEntry) -> str:
    listing = deployment.admin.get("/v1/admin/workers")
    if listing.status_code != 200:
        raise StepFailed(
            f"no worker lifecycle endpoint: GET /v1/admin/workers → {listing.status_code}"
        )
    holders = [w["id"] for w in listing.json()["items"] if entry.id in w["running_jobs"]]
    if len(holders) != 1:
        raise StepFailed(f"no single worker holds {entry.id}: {listing.json()['items']}")
    answer = deployment.admin.post(f"/v1/admin/workers/{holders[0]}/drain", json={"mode": "stop"})
    step.expect(
        "the job's worker is asked to stop (admin API)",
        answer.status_code == 202,
        f"{holders[0]}: HTTP {answer.status_code} {answer.json().get('state', answer.text[:100])}",
    )
    step.facts["stopped_worker"] = holders[0]
    step.facts["stop_requested_at"] = time.time()
    return str(holders[0])


def _resumed(
    deployment: Deployment,
    step: StepResult,
    entry: JobEntry,
    record: Any,
    stopped: str,
    notify: LoopbackEndpoint,
) -> None:
    attempts = record.get("attempts", [])
    stages = {s["name"]: s for s in record.get("stages", [])}
    outputs = {o["path"]: o["sha256"] for o in record.get("outputs", [])}
    first = attempts[0] if attempts else {}
    step.expect(
        "the job completed on another worker incarnation",
        record["state"] == "completed"
        and len(attempts) == 2
        and attempts[-1]["worker_id"] != stopped,
        f"{record['state']}; attempts: {[(a['worker_id'], a['reason']) for a in attempts]}",
    )
    step.expect(
        "the stopped attempt is recorded as worker_lost",
        (first.get("worker_id"), first.get("reason")) == (stopped, "worker_lost"),
        first,
    )
    step.expect(
        "it resumed from the committed stage (not redone)",
        stages.get("clean", {}).get("attempt") == first.get("number")
        and "resumed after: ['clean']" in deployment.logs(entry).get("stdout", ""),
        f"clean committed by attempt {stages.get('clean', {}).get('attempt')}",
    )
    expected = {"clean.csv": _sha(CLEAN), "summary.txt": _sha(SUMMARY)}
    step.expect(
        "restored stage checksum verified, result right",
        outputs == expected,
        {path: sha[:12] + "…" for path, sha in outputs.items()},
    )
    step.expect("the once action ran exactly once", notify.hits["/notify"] == 1, dict(notify.hits))
    step.facts["recovery"] = {
        "job_id": entry.id,
        "stopped_worker": stopped,
        "resumed_on": attempts[-1]["worker_id"] if attempts else None,
        "attempts": attempts,
        "stages": sorted(stages),
        "once_actions": notify.hits["/notify"],
        "outputs": outputs,
        "stop_to_completed_ms": round((time.time() - step.facts["stop_requested_at"]) * 1000, 1),
    }


def _a_worker_is_back(deployment: Deployment, step: StepResult) -> None:
    """Leave the deployment as found: a live worker again (embedded serve starts a new one)."""
    deadline = time.monotonic() + 60
    while True:
        workers = deployment.admin.get("/v1/admin/workers").json()["items"]
        live = [w["id"] for w in workers if w["state"] == "running"]
        if live or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    step.expect("a live worker is serving afterwards", bool(live), live or workers)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
