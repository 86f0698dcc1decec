"""The store port: every durable record goes through it (SQLite or PostgreSQL)."""

from collections.abc import Sequence
from typing import Any, Protocol

from sandcell.domain.cells import SessionCell
from sandcell.domain.quotas import Admission
from sandcell.domain.records import (
    ApiKey,
    Artifact,
    AuditEvent,
    Job,
    LogChunk,
    SecretInfo,
    StoredFile,
    Tenant,
    WorkerInfo,
)
from sandcell.domain.sessions import Session, SessionState
from sandcell.domain.states import JobState, Reason
from sandcell.domain.workers import StopMode, WorkerStatus


class Store(Protocol):
    # tenants and keys
    def add_tenant(self, tenant: Tenant) -> None: ...
    def get_tenant(self, tenant_id: str) -> Tenant | None: ...
    def patch_tenant_quotas(self, tenant_id: str, changes: dict[str, Any]) -> Tenant | None:
        """Set the quota overrides in `changes` (None drops one); None if no such tenant."""

    def add_api_key(self, key: ApiKey, key_hash: str) -> None: ...
    def get_api_key(self, key_id: str) -> tuple[ApiKey, str] | None: ...
    def revoke_api_key(self, key_id: str, at: float) -> bool: ...
    def revoked_key_ids(self, since: float) -> list[str]:
        """The keys revoked at or after `since`."""

    # input files
    def add_file(self, stored: StoredFile) -> None: ...
    def get_file(self, tenant_id: str, file_id: str) -> StoredFile | None: ...
    def delete_file(self, tenant_id: str, file_id: str) -> bool: ...

    # jobs, seen by the API
    def add_job(
        self, job: Job, idempotency: tuple[str, str] | None, admission: Admission | None = None
    ) -> Job:
        """Insert `job`; with (key, body_sha256), return the job already under that key instead.

        Raises IdempotencyMismatch when the key exists with another body hash, and
        QuotaExceeded when `admission`'s quotas or rate limit refuse a new job.
        """

    def get_job(self, tenant_id: str | None, job_id: str) -> Job | None: ...
    def ended_among(self, job_ids: list[str]) -> set[str]:
        """Which of these jobs are terminal (one read for every waiter of an API process)."""

    def list_jobs(
        self, tenant_id: str, state: JobState | None, after: tuple[float, str] | None, limit: int
    ) -> list[Job]: ...
    def request_cancel(self, tenant_id: str, job_id: str, at: float) -> Job | None:
        """Mark cancellation; an accepted job becomes cancelled at once."""

    def retire_job(self, tenant_id: str, job_id: str, at: float) -> Job | None: ...
    def purge_idempotency_keys(self, older_than: float) -> int: ...

    # jobs, seen by a worker (every write carries the fencing token)
    def claim_next(self, worker_id: str, now: float, lease_s: float) -> Job | None: ...
    def claim_jobs(
        self, worker_id: str, now: float, lease_s: float, up_to: int, look_first: bool = True
    ) -> list[Job]:
        """The oldest queued jobs, up to `up_to`, claimed in one transaction: fewer than
        asked means none was left to claim. `look_first`: a read first, so that a claim that
        finds nothing takes no write lock (False when a job is known to be queued)."""

    def expire_unstarted(self, now: float) -> list[str]: ...
    def renew_lease(self, job_id: str, token: int, now: float, lease_s: float) -> bool:
        """Extend the lease; False when the lease is lost. Also reports cancel requests."""

    def cancel_requested(self, job_id: str) -> bool: ...
    def cancels_requested(self, job_ids: list[str]) -> set[str]:
        """Which of these jobs a caller has asked to cancel (one read for a worker's jobs)."""

    def mark_started(
        self, job_id: str, token: int, at: float, image_digest: str, sandbox_id: str
    ) -> None:
        """The job's program is about to run in `sandbox_id`."""

    def append_log(self, job_id: str, token: int, stream: str, data: bytes) -> None: ...
    def add_artifact(self, artifact: Artifact, token: int) -> None: ...
    def add_artifacts(self, job_id: str, found: list[Artifact], token: int) -> None:
        """Record all of `found` in one transaction, or none (StaleLease if not current)."""

    def finish_job(
        self,
        job: Job,
        token: int,
        logs: Sequence[tuple[str, bytes]] = (),
        outputs: Sequence[Artifact] = (),
    ) -> None:
        """Write the terminal fields of `job`, with its last log chunks (stream, data) and its
        output artifacts, in one transaction; StaleLease (and nothing written) if `token` is
        not current."""

    def record_release(
        self, job_id: str, token: int, usage: dict[str, float], detail: str | None
    ) -> None:
        """After a job ended before its sandbox was released (ports.runtime.EarlySink): write
        its usage as it ended with, `released` now known (1: verified), and with `detail`,
        what was left. Only for the attempt `token` ended; a no-op otherwise."""

    def fail_lost_jobs(self, now: float) -> list[str]:
        """Jobs whose lease expired become failed/worker_lost; return their ids."""

    def release_job(self, job_id: str, token: int, now: float) -> None:
        """The owner gives the job up: re-queue it if it has attempts left, else worker_lost."""

    def fail_job(
        self, job_id: str, reason: Reason, detail: str, at: float, token: int | None = None
    ) -> None:
        """End an active job with `reason`; with `token`, only while that token holds it
        (else StaleLease)."""

    # logs and artifacts, seen by the API
    def read_logs(self, job_id: str, after_seq: int) -> list[LogChunk]: ...
    def list_artifacts(self, job_id: str) -> list[Artifact]: ...
    def get_artifact(self, tenant_id: str | None, artifact_id: str) -> Artifact | None: ...
    def delete_job_data(self, job_id: str) -> tuple[list[Artifact], int]:
        """Delete artifacts rows and log chunks; return the artifacts and log bytes removed."""

    def sha256_in_use(self, sha256: str) -> bool: ...

    # workers announce themselves, so the API can tell whether anything will run a job
    def worker_seen(self, worker: WorkerInfo, at: float) -> None: ...
    def worker_stopped(self, worker_id: str, at: float) -> None: ...
    def live_workers(self, seen_since: float) -> list[WorkerInfo]: ...
    def live_worker(self, worker_id: str, seen_since: float) -> WorkerInfo | None: ...
    def request_worker_stop(self, worker_id: str, mode: StopMode, at: float) -> None:
        """Ask a worker to drain or stop; NotFound, or Conflict once it stopped."""

    def worker_stop_request(self, worker_id: str) -> StopMode | None: ...
    def list_workers(
        self, include_stopped: bool, limit: int, worker_id: str | None = None
    ) -> list[WorkerStatus]: ...
    def storage_bytes(self, tenant_id: str) -> int: ...

    # secrets: ciphertext only
    def put_secret(self, tenant_id: str, name: str, ciphertext: bytes, at: float) -> SecretInfo: ...
    def list_secrets(self, tenant_id: str) -> list[SecretInfo]: ...
    def secret_ciphertexts(self, tenant_id: str, names: list[str]) -> dict[str, bytes]: ...
    def delete_secret(self, tenant_id: str, name: str) -> bool: ...

    # stages and once-blocks
    def commit_stage(
        self, job_id: str, token: int, name: str, stored: list[Artifact], at: float
    ) -> list[dict[str, Any]]:
        """Record the stage and its artifacts in one transaction; return the stage's files.

        StaleLease if `token` is not current, Conflict if the stage is already committed.
        """

    def record_once(self, job_id: str, token: int, key: str, at: float) -> bool: ...
    def job_stages(self, job_id: str) -> list[dict[str, Any]]: ...
    def outputs_of(
        self, job_ids: list[str]
    ) -> dict[str, tuple[list[Artifact], list[dict[str, Any]]]]:
        """Each job's artifacts and stages, as list_artifacts and job_stages give them, read
        together for a page of jobs."""

    def job_with_outputs(
        self, tenant_id: str | None, job_id: str
    ) -> tuple[Job, list[Artifact], list[dict[str, Any]]] | None:
        """get_job and outputs_of in one read: a job's record as the API shows it."""

    def once_keys(self, job_id: str) -> list[str]: ...

    # sessions
    def add_session(self, session: Session) -> None: ...
    def get_session(self, tenant_id: str | None, session_id: str) -> Session | None: ...
    def update_session(self, session_id: str, **values: Any) -> None: ...
    def list_sessions(self, tenant_id: str, live_only: bool, limit: int) -> list[Session]: ...
    def sessions_of_worker(self, worker_id: str, states: list[SessionState]) -> list[Session]: ...
    def count_live_sessions(self, tenant_id: str) -> int: ...
    def add_session_cell(self, cell: SessionCell, keep: int) -> SessionCell:
        """Record an executed cell under the session's next number, keeping the newest `keep`;
        the session counts it and was last used at its end.

        Raises NotFound if the session is not the cell's tenant's.
        """

    def session_cells(
        self, tenant_id: str, session_id: str, after: int | None, limit: int
    ) -> list[SessionCell]:
        """Oldest first: the `limit` cells numbered above `after`, or else the newest `limit`."""

    def fail_orphan_sessions(self, live_worker_ids: list[str], now: float) -> list[str]: ...

    # audit
    def audit(self, event: AuditEvent) -> None: ...
    def audit_events(
        self, tenant_id: str | None, action: str | None, before: float | None, limit: int
    ) -> list[AuditEvent]: ...

    # metrics
    def job_counts(self) -> dict[tuple[str, str], int]: ...
    def phase_histogram(self, phase: str, bounds_s: list[float]) -> tuple[list[int], float, int]:
        """Cumulative counts per bound, sum and count of `phase` ("queue", "start", "run")."""

    def ping(self) -> None: ...
