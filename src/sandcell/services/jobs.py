"""Jobs as the API sees them: submit, read, list, cancel, retire."""

import base64
import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

from sandcell.domain.errors import (
    Conflict,
    FieldError,
    InvalidRequest,
    NotFound,
)
from sandcell.domain.ids import new_id
from sandcell.domain.limits import Limits
from sandcell.domain.quotas import Admission, Quotas
from sandcell.domain.records import Artifact, InputRef, Job, JobSpec, LogChunk, Tenant
from sandcell.domain.states import JobState
from sandcell.ports.artifacts import BlobStore
from sandcell.ports.images import ImageCatalog
from sandcell.ports.notify import (
    ANY,
    JOB_CANCEL,
    JOB_DONE,
    JOB_QUEUED,
    TENANT_CHANGED,
    LocalNotifier,
    Notifier,
)
from sandcell.ports.secrets import NetworkValidator
from sandcell.ports.store import Store
from sandcell.services.audit import AuditLog
from sandcell.services.auth import Principal
from sandcell.services.validation import RequestValidator


@dataclass(frozen=True)
class Submission:
    """A job request after syntactic validation at the edge."""

    image: str | None
    code: str | None
    command: list[str] | None
    inputs: list[InputRef] = field(default_factory=list)
    limits: dict[str, Any] = field(default_factory=dict)  # only the fields the caller set
    env: dict[str, str] = field(default_factory=dict)
    network: dict[str, Any] = field(default_factory=dict)
    secrets: list[dict[str, Any]] = field(default_factory=list)
    retry: dict[str, Any] = field(default_factory=dict)
    expires_in_s: float | None = None


@dataclass(frozen=True)
class JobPolicy:
    default_image: str
    default_limits: Limits
    max_limits: Limits
    quotas: Quotas = field(default_factory=Quotas)

    def quotas_for(self, tenant: Tenant) -> Quotas:
        return replace(self.quotas, **tenant.quotas)


def body_fingerprint(body: Any) -> str:
    """sha256 of the canonical JSON of a request body, for Idempotency-Key comparison."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def encode_cursor(job: Job) -> str:
    return base64.urlsafe_b64encode(f"{job.accepted_at!r}|{job.id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        at, job_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        return float(at), job_id
    except ValueError as exc:
        raise InvalidRequest(errors=[FieldError("cursor", "not a cursor from this API")]) from exc


TENANT_FRESH_S = 1.0


class JobService:
    def __init__(
        self,
        store: Store,
        blobs: BlobStore,
        images: ImageCatalog,
        policy: JobPolicy,
        network: NetworkValidator | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.store = store
        # Wakes workers on submit and `?wait=` callers on a job's end; in-process by default.
        self.notifier: Notifier = notifier or LocalNotifier()
        self.blobs = blobs
        self.images = images
        self.policy = policy
        self.audit = AuditLog(store)
        self.check = RequestValidator(
            store, images, policy.default_limits, policy.max_limits, network
        )
        # Tenants as read lately: a submit needs its tenant's limits and quotas, which change
        # seldom; a change is heard at once (TENANT_CHANGED), or seen within TENANT_FRESH_S.
        self._tenants: dict[str, tuple[Tenant, float]] = {}
        self.notifier.listen(TENANT_CHANGED, self._forget_tenant)

    # submit

    def submit(
        self, who: Principal, sub: Submission, idempotency: tuple[str, str] | None
    ) -> tuple[Job, bool]:
        """Accept a job; return it and whether it is new (False: an idempotent replay)."""
        who.require("jobs")
        tenant = self._tenant(who)
        spec = self._validated_spec(tenant, sub)
        now = time.time()
        job = Job(
            id=new_id("job"),
            tenant_id=tenant.id,
            state=JobState.ACCEPTED,
            spec=spec,
            accepted_at=now,
            expires_at=now + sub.expires_in_s if sub.expires_in_s else None,
        )
        admission = Admission(self.policy.quotas_for(tenant), now)
        stored = self.store.add_job(job, idempotency, admission)
        if stored.id == job.id:
            self.notifier.notify(JOB_QUEUED, job.id)
        return stored, stored.id == job.id

    def quotas(self, who: Principal) -> Quotas:
        return self.policy.quotas_for(self._tenant(who))

    def _tenant(self, who: Principal) -> Tenant:
        tenant_id = who.tenant()
        found = self._tenants.get(tenant_id)
        if found is not None and time.monotonic() - found[1] < TENANT_FRESH_S:
            return found[0]
        tenant = self.store.get_tenant(tenant_id)
        if tenant is None:
            raise NotFound("tenant no longer exists")
        self._tenants[tenant_id] = (tenant, time.monotonic())
        return tenant

    def _forget_tenant(self, tenant_id: str) -> None:  # any thread; ANY: every tenant
        if tenant_id == ANY:
            self._tenants.clear()
        else:
            self._tenants.pop(tenant_id, None)

    def _validated_spec(self, tenant: Tenant, sub: Submission) -> JobSpec:
        errors: list[FieldError] = []
        image = sub.image or self.policy.default_image
        errors += self.check.image_errors(tenant, image)
        limits, limit_errors = self.check.limits(tenant, sub.limits)
        errors += limit_errors
        errors += self.check.input_errors(tenant, sub.inputs)
        errors += self.check.network_errors(tenant, sub.network, sub.secrets)
        if errors:
            raise InvalidRequest("the job request is invalid", errors)
        return JobSpec(
            image=image,
            code=sub.code,
            command=sub.command,
            inputs=sub.inputs,
            limits=limits,
            env=sub.env,
            network=sub.network,
            retry=sub.retry,
            secrets=sub.secrets,
        )

    # read

    def get(self, who: Principal, job_id: str) -> Job:
        job = self.store.get_job(who.tenant(), job_id)
        if job is None:
            raise NotFound("no such job")
        return job

    def get_with_outputs(
        self, who: Principal, job_id: str
    ) -> tuple[Job, list[Artifact], list[dict[str, Any]]]:
        """The job with its outputs and stages, read together."""
        found = self.store.job_with_outputs(who.tenant(), job_id)
        if found is None:
            raise NotFound("no such job")
        return found

    def list_jobs(
        self, who: Principal, state: JobState | None, cursor: str | None, limit: int
    ) -> tuple[list[Job], str | None]:
        after = decode_cursor(cursor) if cursor else None
        page = self.store.list_jobs(who.tenant(), state, after, limit + 1)
        more = len(page) > limit
        page = page[:limit]
        return page, encode_cursor(page[-1]) if more and page else None

    def logs(self, who: Principal, job_id: str, after_seq: int = -1) -> list[LogChunk]:
        self.get(who, job_id)
        return self.store.read_logs(job_id, after_seq)

    # change

    def cancel(self, who: Principal, job_id: str) -> Job:
        who.require("jobs")
        job = self.store.request_cancel(who.tenant(), job_id, time.time())
        if job is None:
            raise NotFound("no such job")
        if job.state.is_terminal:  # an accepted job is cancelled at once
            self.notifier.notify(JOB_DONE, job.id)
        else:  # its worker stops it now, not at its next look at the store
            self.notifier.notify(JOB_CANCEL, job.id)
        self.audit.record("job.cancel", actor=who.key_id, tenant_id=job.tenant_id, target=job.id)
        return job

    def retire(self, who: Principal, job_id: str) -> dict[str, Any]:
        """Remove what the job left behind now; report what was removed and what was not."""
        who.require("jobs")
        job = self.get(who, job_id)
        if not job.state.is_terminal:
            raise Conflict("the job is still running; cancel it first, then retire it")
        retired = self.store.retire_job(who.tenant(), job_id, time.time())
        assert retired is not None
        removed, log_bytes = self.store.delete_job_data(job_id)
        for sha in {a.sha256 for a in removed}:
            if not self.store.sha256_in_use(sha):
                self.blobs.delete(sha, stored_by=job.finished_at)
        report = deletion_report(job, removed, log_bytes)
        self.audit.record(
            "job.retire",
            actor=who.key_id,
            tenant_id=job.tenant_id,
            target=job.id,
            artifacts=len(removed),
            log_bytes=log_bytes,
        )
        return report


def deletion_report(job: Job, removed: list[Any], log_bytes: int) -> dict[str, Any]:
    return {
        "job_id": job.id,
        "already_retired": job.retired_at is not None,
        "removed": {
            "artifacts": [
                {"artifact_id": a.id, "path": a.path, "size": a.size, "sha256": a.sha256}
                for a in removed
            ],
            "artifact_bytes": sum(a.size for a in removed),
            "log_bytes": log_bytes,
            "code_and_env": True,
            "inputs": "the sandbox's copy of /input was destroyed with the sandbox",
            "workspace": "destroyed with the sandbox when the job ended",
            "secrets_material": (
                "the job's CA key and secret values lived only in the worker's memory and "
                "were dropped when the job ended; the tenant's stored secrets remain "
                "(DELETE /v1/secrets/{name})"
                if job.spec.secrets
                else "none: the job was given no secrets"
            ),
        },
        "kept": {
            "job_record": "id, state, reason, timings and usage remain as a tombstone",
            "input_files": [
                {"file_id": ref.file_id, "remove_with": f"DELETE /v1/files/{ref.file_id}"}
                for ref in job.spec.inputs
            ],
        },
        "caller_must_remove": [
            "copies of artifacts downloaded before now",
            "signed URLs issued for this job's artifacts stop working now; nothing to do",
        ],
    }
