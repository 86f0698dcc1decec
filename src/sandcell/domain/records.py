"""The durable records of sandcell, as plain values."""

from dataclasses import dataclass, field
from typing import Any

from sandcell.domain.limits import Limits
from sandcell.domain.states import JobState, Reason


@dataclass(frozen=True)
class Tenant:
    id: str
    name: str
    limits: dict[str, Any]  # per-tenant maxima, overriding the configured ones
    images: list[str] | None  # None: every built image
    created_at: float
    quotas: dict[str, Any] = field(default_factory=dict)  # overrides of the configured quotas


@dataclass(frozen=True)
class ApiKey:
    id: str
    tenant_id: str | None  # None for admin keys
    scopes: list[str]
    created_at: float
    revoked_at: float | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes


@dataclass(frozen=True)
class StoredFile:
    id: str
    tenant_id: str
    name: str
    size: int
    sha256: str
    created_at: float


@dataclass(frozen=True)
class InputRef:
    file_id: str
    path: str  # relative to /input


@dataclass(frozen=True)
class JobSpec:
    """What the caller asked for; never changed after acceptance."""

    image: str
    code: str | None
    command: list[str] | None
    inputs: list[InputRef]
    limits: Limits
    env: dict[str, str]
    network: dict[str, Any] = field(default_factory=dict)
    retry: dict[str, Any] = field(default_factory=dict)
    secrets: list[dict[str, Any]] = field(default_factory=list)  # bindings; values never here


@dataclass
class Job:
    id: str
    tenant_id: str
    state: JobState
    spec: JobSpec
    accepted_at: float
    expires_at: float | None
    reason: Reason | None = None
    exit_code: int | None = None
    detail: str = ""
    image_digest: str | None = None
    runtime: str | None = None
    runtime_version: str | None = None
    claimed_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    cancel_requested_at: float | None = None
    retired_at: float | None = None
    worker_id: str | None = None
    lease_expires_at: float | None = None
    fencing_token: int = 0
    usage: dict[str, float] = field(default_factory=dict)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    egress: list[dict[str, Any]] = field(default_factory=list)
    pooled: bool = False  # the sandbox came from a warm pool (booted before the job)
    # The sandbox (runsc container, cgroup, scratch dir) of the current or last attempt: a
    # pooled job runs in the warm sandbox it took (`pool-<image>-<hex>`), not `<job>-<token>`.
    sandbox_id: str | None = None


@dataclass(frozen=True)
class Artifact:
    id: str
    tenant_id: str
    job_id: str
    path: str
    size: int
    sha256: str
    created_at: float


@dataclass(frozen=True)
class LogChunk:
    seq: int
    stream: str
    data: bytes


# A worker seen this recently counts as live: it reports in every second.
LIVE_WORKER_S = 10.0


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    runtime: str
    runtime_version: str
    started_at: float
    url: str | None = None  # the worker's session host, for API replicas
    # The worker's warm pools as of its last report (see runtime/pool.py `figures`), by kind
    # ("jobs", "sessions"); None when it has none. Read by /metrics in any process.
    pools: dict[str, Any] | None = None
    # What the worker's runtime reports of its host (ports.runtime.HealthReporter); None when
    # it reports nothing.
    health: dict[str, int] | None = None


@dataclass(frozen=True)
class AuditEvent:
    id: str
    at: float
    tenant_id: str | None
    actor: str | None  # the API key id, "env-admin", or None when no key was recognised
    action: str  # e.g. "tenant.create", "key.revoke", "auth.failure", "job.cancel"
    target: str | None
    outcome: str  # "ok" | "denied"
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SecretInfo:
    """What the API may show of a secret: never its value."""

    name: str
    created_at: float
    updated_at: float
