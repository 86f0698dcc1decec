"""Step 1: two tenants, distinct inputs and artifacts; every cross-tenant attempt fails (404)."""

import hashlib
import secrets
from typing import Any

from sandcell.acceptance.checks import StepResult
from sandcell.acceptance.deployment import Deployment, JobEntry, Tenant

# Reads the tenant's input, writes a derived artifact, logs a line: one of each resource.
PROGRAM = """
data = open("/input/data.txt", "rb").read()
open("/output/result.txt", "wb").write(data.upper())
print("bytes in:", len(data), flush=True)
"""


def run(deployment: Deployment, step: StepResult, shared: dict[str, Any]) -> None:
    owners = [deployment.tenant("a"), deployment.tenant("b")]
    inputs = [f"tenant {t.id} input {secrets.token_hex(8)}\n".encode() for t in owners]
    jobs = [_job(deployment, t, data) for t, data in zip(owners, inputs, strict=True)]
    records = [deployment.finish(job) for job in jobs]
    for tenant, data, record in zip(owners, inputs, records, strict=True):
        _own_output_is_right(step, tenant, data, record)
    shared.update(tenants=owners, step1_jobs=jobs)
    probes = 0
    for mine, theirs, record in ((0, 1, records[0]), (1, 0, records[1])):
        probes += _cross_attempts(step, owners[theirs], owners[mine], record, jobs[mine])
    step.facts["cross_tenant_attempts"] = probes


def _job(deployment: Deployment, tenant: Tenant, data: bytes) -> JobEntry:
    stored = deployment.upload(tenant, "data.txt", data)
    body = {"code": PROGRAM, "inputs": [{"file_id": stored["id"], "path": "data.txt"}]}
    return deployment.submit(tenant, body, step=1)


def _own_output_is_right(step: StepResult, tenant: Tenant, data: bytes, record: Any) -> None:
    outputs = {o["path"]: o for o in record.get("outputs", [])}
    expected = hashlib.sha256(data.upper()).hexdigest()
    found = outputs.get("result.txt", {})
    step.expect(
        f"{tenant.id}: its job completed with its own artifact",
        record["state"] == "completed" and found.get("sha256") == expected,
        f"state={record['state']} sha256={found.get('sha256', '-')[:12]}… "
        f"expected {expected[:12]}…",
    )
    if found:
        content = tenant.http.get(f"/v1/artifacts/{found['artifact_id']}/content").content
        step.expect(
            f"{tenant.id}: downloads its own artifact",
            content == data.upper(),
            f"{len(content)} bytes",
        )


def _cross_attempts(
    step: StepResult, intruder: Tenant, owner: Tenant, record: Any, job: JobEntry
) -> int:
    """Every read, cancel, log, artifact and signed-URL request on another tenant's ids."""
    artifact = record["outputs"][0]["artifact_id"] if record.get("outputs") else "art_missing"
    file_id = owner.files[-1]
    attempts = [
        ("GET", f"/v1/jobs/{job.id}"),
        ("GET", f"/v1/jobs/{job.id}/logs"),
        ("POST", f"/v1/jobs/{job.id}/cancel"),
        ("DELETE", f"/v1/jobs/{job.id}"),
        ("GET", f"/v1/artifacts/{artifact}"),
        ("GET", f"/v1/artifacts/{artifact}/content"),
        ("POST", f"/v1/artifacts/{artifact}/url"),
        ("GET", f"/v1/files/{file_id}"),
        ("DELETE", f"/v1/files/{file_id}"),
    ]
    answers = {f"{m} {p}": intruder.http.request(m, p).status_code for m, p in attempts}
    wrong = {k: v for k, v in answers.items() if v != 404}
    step.expect(
        f"{intruder.id} → {owner.id}: read, cancel, log, artifact, signed URL, file",
        not wrong,
        f"{len(answers)} attempts, all 404" if not wrong else f"not 404: {wrong}",
    )
    listed = intruder.http.get("/v1/jobs").json().get("items", [])
    step.expect(
        f"{intruder.id}: its job list holds none of {owner.id}'s",
        job.id not in {j["id"] for j in listed},
        f"{len(listed)} jobs listed",
    )
    return len(answers) + 1
