"""The deployment under test, over HTTP: an admin client, tenants made for this run, and a
ledger of every job submitted (with its ack, ready and done latencies)."""

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from sandcell.acceptance.checks import StepFailed

TERMINAL = ("completed", "failed", "cancelled")
Json = dict[str, Any]


@dataclass
class Tenant:
    id: str
    key_id: str
    http: httpx.Client
    files: list[str] = field(default_factory=list)
    secrets: list[str] = field(default_factory=list)


@dataclass
class JobEntry:
    """One submitted job: client-side ack and done, server-side ready (accepted → started)."""

    id: str
    step: int
    tenant: Tenant
    submitted: float  # monotonic, at the client
    ack_ms: float
    record: Json = field(default_factory=dict)
    done_ms: float | None = None

    @property
    def ready_ms(self) -> float | None:
        queue, start = self.record.get("queue_ms"), self.record.get("start_ms")
        return None if queue is None or start is None else float(queue) + float(start)


class Deployment:
    def __init__(self, url: str, admin_key: str, timeout_s: float = 60) -> None:
        self.url = url.rstrip("/")
        self.run_id = secrets.token_hex(4)
        self.timeout = httpx.Timeout(timeout_s, connect=10)
        self.admin = httpx.Client(
            base_url=self.url, headers=_bearer(admin_key), timeout=self.timeout
        )
        self.anonymous = httpx.Client(base_url=self.url, timeout=self.timeout)
        self.tenants: list[Tenant] = []
        self.jobs: list[JobEntry] = []
        self._lock = threading.Lock()

    def tenant(self, label: str) -> Tenant:
        """A new tenant with a key of its own; the key is revoked at cleanup."""
        name = f"acceptance-{self.run_id}-{label}"
        made = self.admin.post("/v1/admin/tenants", json={"name": name})
        _require(made, 201, f"create tenant {name}")
        tenant_id = made.json()["id"]
        key = self.admin.post(f"/v1/admin/tenants/{tenant_id}/keys", json={})
        _require(key, 201, f"create a key for {tenant_id}")
        http = httpx.Client(
            base_url=self.url, headers=_bearer(key.json()["key"]), timeout=self.timeout
        )
        tenant = Tenant(tenant_id, key.json()["id"], http)
        self.tenants.append(tenant)
        return tenant

    def upload(self, tenant: Tenant, name: str, content: bytes) -> Json:
        answer = tenant.http.post("/v1/files", files={"file": (name, content)})
        _require(answer, 201, f"upload {name}")
        tenant.files.append(answer.json()["id"])
        return dict(answer.json())

    def submit(self, tenant: Tenant, body: Json, step: int) -> JobEntry:
        began = time.monotonic()
        answer = tenant.http.post("/v1/jobs", json=body)
        ack_ms = (time.monotonic() - began) * 1000
        _require(answer, 202, "submit a job")
        entry = JobEntry(answer.json()["id"], step, tenant, began, round(ack_ms, 1))
        entry.record = dict(answer.json())
        with self._lock:
            self.jobs.append(entry)
        return entry

    def finish(self, entry: JobEntry, timeout_s: float = 120) -> Json:
        """Long-poll until the job is terminal; its done latency is measured at the client."""
        deadline = time.monotonic() + timeout_s
        record = entry.record
        while record.get("state") not in TERMINAL:
            if time.monotonic() > deadline:
                raise StepFailed(f"job {entry.id} not finished after {timeout_s:.0f} s: {record}")
            record = self.record(entry, wait=min(20.0, max(0.1, deadline - time.monotonic())))
        if entry.done_ms is None:
            entry.done_ms = round((time.monotonic() - entry.submitted) * 1000, 1)
        return record

    def record(self, entry: JobEntry, wait: float = 0) -> Json:
        answer = entry.tenant.http.get(f"/v1/jobs/{entry.id}", params={"wait": wait})
        _require(answer, 200, f"read job {entry.id}")
        entry.record = dict(answer.json())
        return entry.record

    def logs(self, entry: JobEntry) -> Json:
        answer = entry.tenant.http.get(f"/v1/jobs/{entry.id}/logs")
        _require(answer, 200, f"read the logs of {entry.id}")
        return dict(answer.json())

    def close(self) -> None:
        for client in [self.admin, self.anonymous, *(t.http for t in self.tenants)]:
            client.close()


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _require(answer: httpx.Response, status: int, what: str) -> None:
    if answer.status_code != status:
        raise StepFailed(f"{what}: HTTP {answer.status_code} {answer.text[:300]}")
