"""Step 3: a finite workload; jobs hit the timeout and the memory limit and end with the right
reason, their resources released; a cancelled job is verified terminated.

"Released" and "terminated" are read from the job record, as any client would: the worker
sets `usage.released` to 1 only after it verified that every process of the sandbox is gone
and its host resources removed, and a job becomes `cancelled` only after that verification.
"""

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandcell.acceptance.checks import StepFailed, StepResult
from sandcell.acceptance.deployment import Deployment, JobEntry, Tenant

TIMEOUT = {"code": "import time; time.sleep(60)", "limits": {"timeout_s": 2}}
MEMORY = {
    "code": "chunks = []\nwhile True: chunks.append(bytearray(16 * 2**20))",
    "limits": {"memory_mb": 128, "timeout_s": 60},
}
# Ignores SIGTERM and leaves a double-forked, setsid grandchild behind: cancel must get it too.
STUBBORN = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while True: time.sleep(1)
    os._exit(0)
print('ready', flush=True)
while True: time.sleep(1)
"""


def run(deployment: Deployment, step: StepResult, shared: dict[str, Any], load: int) -> None:
    tenant = deployment.tenant("load")
    _workload(deployment, step, tenant, load)
    for reason, body in (("timeout", TIMEOUT), ("memory", MEMORY)):
        record = deployment.finish(deployment.submit(tenant, body, step=3))
        _ended(step, f"a job over its {reason} limit", record, ("failed", reason))
    _cancel(deployment, step, tenant)


def _workload(deployment: Deployment, step: StepResult, tenant: Tenant, load: int) -> None:
    """`load` small jobs submitted at once; each must complete."""
    bodies = [{"code": f"print(sum(range({i} * 1000)))"} for i in range(load)]
    with ThreadPoolExecutor(max(1, min(8, load))) as pool:
        entries = list(pool.map(lambda b: deployment.submit(tenant, b, step=3), bodies))
        records = list(pool.map(lambda e: deployment.finish(e, timeout_s=300), entries))
    completed = sum(r["state"] == "completed" for r in records)
    step.facts["workload"] = {"submitted": load, "completed": completed}
    step.expect(f"a workload of {load} jobs completes", completed == load, f"{completed}/{load}")


def _ended(step: StepResult, what: str, record: Any, expected: tuple[str, str]) -> None:
    released = record.get("usage", {}).get("released")
    step.expect(
        f"{what} ends {expected[0]}/{expected[1]}, resources released",
        (record["state"], record["reason"]) == expected and released == 1,
        f"{record['state']}/{record['reason']}, usage.released={released}, "
        f"run {record.get('run_ms')} ms",
    )


def _cancel(deployment: Deployment, step: StepResult, tenant: Tenant) -> None:
    entry = deployment.submit(tenant, {"code": STUBBORN, "limits": {"timeout_s": 120}}, step=3)
    _wait_for_output(deployment, entry, "ready", timeout_s=90)
    began = time.monotonic()
    answer = tenant.http.post(f"/v1/jobs/{entry.id}/cancel")
    answered_ms = round((time.monotonic() - began) * 1000, 1)
    step.expect("cancel answers 202 at once", answer.status_code == 202, f"{answered_ms} ms")
    record = deployment.finish(entry, timeout_s=60)
    _ended(
        step, "a cancelled job (SIGTERM ignored, double fork)", record, ("cancelled", "cancelled")
    )
    step.facts["cancel_to_terminated_ms"] = round((time.monotonic() - began) * 1000, 1)


def _wait_for_output(deployment: Deployment, entry: JobEntry, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in deployment.logs(entry).get("stdout", ""):
        if deployment.record(entry)["state"] in ("completed", "failed", "cancelled"):
            raise StepFailed(f"job {entry.id} ended before it printed {text!r}: {entry.record}")
        if time.monotonic() > deadline:
            raise StepFailed(f"job {entry.id} did not print {text!r} in {timeout_s:.0f} s")
        time.sleep(0.2)
