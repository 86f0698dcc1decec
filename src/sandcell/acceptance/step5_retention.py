"""Step 5: retiring a job removes what the retention policy says, and reports it."""

from typing import Any

from sandcell.acceptance.checks import StepFailed, StepResult
from sandcell.acceptance.deployment import Deployment, JobEntry


def run(deployment: Deployment, step: StepResult, shared: dict[str, Any]) -> None:
    jobs: list[JobEntry] = shared.get("step1_jobs", [])
    if not jobs:
        raise StepFailed("step 1 left no finished job with an artifact to retire")
    entry = jobs[0]
    record = deployment.record(entry)
    outputs = record.get("outputs", [])
    answer = entry.tenant.http.delete(f"/v1/jobs/{entry.id}")
    if answer.status_code != 200:
        raise StepFailed(f"DELETE /v1/jobs/{entry.id}: HTTP {answer.status_code} {answer.text}")
    report = answer.json()
    removed = report.get("removed", {})
    _reported(step, outputs, removed, report)
    _gone(deployment, step, entry, outputs, shared.get("signed_url", ""))
    again = entry.tenant.http.delete(f"/v1/jobs/{entry.id}").json()
    step.expect("retiring again reports it was retired", again.get("already_retired"), again)
    step.facts["deletion_report"] = report


def _reported(step: StepResult, outputs: list[Any], removed: Any, report: Any) -> None:
    listed = sorted(a["artifact_id"] for a in removed.get("artifacts", []))
    step.expect(
        "the report lists every artifact removed",
        bool(listed) and listed == sorted(o["artifact_id"] for o in outputs),
        f"{len(listed)} artifacts, {removed.get('artifact_bytes')} bytes",
    )
    step.expect(
        "the report counts the log bytes and code removed",
        removed.get("log_bytes", 0) > 0 and removed.get("code_and_env") is True,
        f"log_bytes={removed.get('log_bytes')}",
    )
    step.expect(
        "the report says what the caller must remove elsewhere",
        bool(report.get("caller_must_remove")) and "kept" in report,
        f"{len(report.get('caller_must_remove', []))} items elsewhere; "
        f"kept: {sorted(report.get('kept', {}))}",
    )


def _gone(
    deployment: Deployment,
    step: StepResult,
    entry: JobEntry,
    outputs: list[Any],
    signed_url: str,
) -> None:
    http = entry.tenant.http
    answers = {}
    for output in outputs:
        answers[output["path"]] = http.get(f"/v1/artifacts/{output['artifact_id']}/content")
    codes = {path: a.status_code for path, a in answers.items()}
    step.expect("its artifacts are gone", all(c == 404 for c in codes.values()), codes)
    logs = http.get(f"/v1/jobs/{entry.id}/logs").json()
    step.expect("its logs are gone", not logs.get("stdout") and not logs.get("stderr"), logs)
    if signed_url:
        code = deployment.anonymous.get(signed_url).status_code
        step.expect("a signed URL issued before stops working", code in (401, 404, 410), code)
    tombstone = http.get(f"/v1/jobs/{entry.id}").json()
    step.expect(
        "the record stays as a tombstone (state, timings)",
        tombstone.get("retired_at") and tombstone.get("state") == "completed",
        f"retired_at={tombstone.get('retired_at')}",
    )
