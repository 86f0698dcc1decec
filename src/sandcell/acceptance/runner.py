"""Runs the steps in order (each one's failure is recorded, the others still run), then
removes what the run made: jobs retired, files and secrets deleted, keys revoked."""

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from sandcell.acceptance import (
    report,
    step1_isolation,
    step2_network,
    step3_limits,
    step4_recovery,
    step5_retention,
)
from sandcell.acceptance.checks import StepFailed, StepResult
from sandcell.acceptance.deployment import TERMINAL, Deployment

StepRun = Callable[[Deployment, StepResult, dict[str, Any]], None]


@dataclass(frozen=True)
class Options:
    url: str
    admin_key: str
    steps: tuple[int, ...] = (1, 2, 3, 4, 5)
    load: int = 8  # small jobs in step 3's workload
    timeout_s: float = 60


@dataclass
class Run:
    deployment: Deployment
    shared: dict[str, Any] = field(default_factory=dict)


STEPS: dict[int, str] = {
    1: "tenant isolation",
    2: "network policy, URLs without auth, secrets",
    3: "limits, release and cancellation",
    4: "worker stopped, job resumes from its stage",
    5: "retention: retire and report",
}


def _runners(options: Options) -> dict[int, StepRun]:
    return {
        1: step1_isolation.run,
        2: step2_network.run,
        3: lambda d, s, shared: step3_limits.run(d, s, shared, options.load),
        4: step4_recovery.run,
        5: step5_retention.run,
    }


def run_acceptance(
    options: Options, on_step: Callable[[StepResult], None] | None = None
) -> dict[str, Any]:
    deployment = Deployment(options.url, options.admin_key, options.timeout_s)
    shared: dict[str, Any] = {}
    results = []
    try:
        runners = _runners(options)
        # Steps 2 and 5 reuse what step 1 made (a tenant, an artifact): it always runs first.
        for number in sorted(set(options.steps) | ({1} if {2, 5} & set(options.steps) else set())):
            results.append(_step(number, runners[number], deployment, shared))
            if on_step is not None:
                on_step(results[-1])
    finally:
        cleanup = clean_up(deployment)
        deployment.close()
    return report.build(options.url, results, deployment.jobs, cleanup)


def _step(number: int, run: StepRun, deployment: Deployment, shared: dict[str, Any]) -> StepResult:
    result = StepResult(number, STEPS[number])
    began = time.monotonic()
    try:
        run(deployment, result, shared)
    except StepFailed as exc:
        result.error = str(exc)
    except httpx.HTTPError as exc:
        result.error = f"HTTP: {type(exc).__name__}: {exc}"
    except Exception as exc:  # a bug or an unexpected answer: report it, keep going
        result.error = f"{type(exc).__name__}: {exc} ({_where(exc)})"
    result.seconds = time.monotonic() - began
    return result


def _where(exc: Exception) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "?"


def clean_up(deployment: Deployment) -> dict[str, Any]:
    """Best effort, and reported: what was removed, and what could not be."""
    done: dict[str, Any] = {"jobs_retired": 0, "files_deleted": 0, "secrets_deleted": 0}
    done["keys_revoked"], problems = 0, []
    for job in deployment.jobs:
        http = job.tenant.http
        try:
            if job.record.get("state") not in TERMINAL:
                http.post(f"/v1/jobs/{job.id}/cancel")
                deployment.finish(job, timeout_s=60)
            done["jobs_retired"] += http.delete(f"/v1/jobs/{job.id}").status_code == 200
        except Exception as exc:
            problems.append(f"job {job.id}: {exc}")
    for tenant in deployment.tenants:
        try:
            for file_id in tenant.files:
                deleted = tenant.http.delete(f"/v1/files/{file_id}").status_code == 204
                done["files_deleted"] += deleted
            for name in tenant.secrets:
                deleted = tenant.http.delete(f"/v1/secrets/{name}").status_code == 204
                done["secrets_deleted"] += deleted
            revoked = deployment.admin.delete(f"/v1/admin/keys/{tenant.key_id}").status_code
            done["keys_revoked"] += revoked == 204
            if revoked != 204:
                problems.append(f"key {tenant.key_id} of {tenant.id}: HTTP {revoked}")
        except httpx.HTTPError as exc:
            problems.append(f"tenant {tenant.id}: {exc}")
    done["tenants_left"] = [t.id for t in deployment.tenants]  # no API removes a tenant
    done["problems"] = problems
    return done
