"""The schema, as SQLAlchemy Core tables shared by SQLite and PostgreSQL."""

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

tenants = Table(
    "tenants",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("limits", JSON, nullable=False),
    Column("images", JSON),
    Column("created_at", Float, nullable=False),
    Column("quotas", JSON),
    # The sizes of the tenant's files and artifacts, kept in the transactions that add and
    # remove them: admission reads one row instead of summing the tenant's whole history.
    Column("stored_bytes", BigInteger, nullable=False, server_default="0"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant_id", String(64), ForeignKey("tenants.id")),
    Column("key_hash", String(64), nullable=False),
    Column("scopes", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("revoked_at", Float),
    Index("api_keys_by_revoked", "revoked_at"),  # workers ask for the recently revoked ones
)

files = Table(
    "files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant_id", String(64), ForeignKey("tenants.id"), nullable=False),
    Column("name", String(255), nullable=False),
    Column("size", Integer, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Index("files_by_sha", "sha256"),  # is a blob still in use, when an artifact goes
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant_id", String(64), ForeignKey("tenants.id"), nullable=False),
    Column("state", String(16), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("accepted_at", Float, nullable=False),
    Column("expires_at", Float),
    Column("reason", String(32)),
    Column("exit_code", Integer),
    Column("detail", Text, nullable=False, default=""),
    Column("image_digest", String(80)),
    Column("runtime", String(32)),
    Column("runtime_version", String(80)),
    Column("claimed_at", Float),
    Column("started_at", Float),
    Column("finished_at", Float),
    Column("cancel_requested_at", Float),
    Column("retired_at", Float),
    Column("worker_id", String(64)),
    Column("lease_expires_at", Float),
    Column("fencing_token", Integer, nullable=False, default=0),
    Column("usage", JSON, nullable=False),
    Column("attempts", JSON, nullable=False),
    Column("egress", JSON),
    Column("pooled", Boolean, nullable=False, default=False),  # ran in a warm-pool sandbox
    Column("sandbox_id", String(128)),  # the current or last attempt's sandbox
    Index("jobs_queue", "state", "accepted_at"),
    Index("jobs_by_tenant", "tenant_id", "accepted_at", "id"),
    Index("jobs_by_tenant_state", "tenant_id", "state"),  # admission counts the active ones
)

idempotency_keys = Table(
    "idempotency_keys",
    metadata,
    Column("tenant_id", String(64), primary_key=True),
    Column("key", String(255), primary_key=True),
    Column("body_sha256", String(64), nullable=False),
    Column("job_id", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
)

job_logs = Table(
    "job_logs",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("stream", String(8), nullable=False),
    Column("data", LargeBinary, nullable=False),
)

artifacts = Table(
    "artifacts",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant_id", String(64), ForeignKey("tenants.id"), nullable=False),
    Column("job_id", String(64), ForeignKey("jobs.id"), nullable=False),
    Column("path", Text, nullable=False),
    Column("size", Integer, nullable=False),
    Column("sha256", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    Index("artifacts_by_job", "job_id"),
    Index("artifacts_by_sha", "sha256"),
)

workers = Table(
    "workers",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("runtime", String(32), nullable=False),
    Column("runtime_version", String(80), nullable=False),
    Column("started_at", Float, nullable=False),
    Column("seen_at", Float, nullable=False),
    Column("stopped_at", Float),
    Column("url", String(255)),  # where API replicas reach this worker's session host
    Column("stop_mode", String(16)),  # an operator's drain/stop request, read by the worker
    Column("stop_requested_at", Float),
    Column("pools", JSON),  # the worker's warm-pool figures, refreshed with its heartbeat
    Column("health", JSON),  # what its runtime reports of the host, likewise
)

rate_buckets = Table(
    "rate_buckets",
    metadata,
    Column("tenant_id", String(64), primary_key=True),
    Column("bucket", String(32), primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

audit_events = Table(
    "audit_events",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("at", Float, nullable=False),
    Column("tenant_id", String(64)),
    Column("actor", String(64)),
    Column("action", String(64), nullable=False),
    Column("target", String(128)),
    Column("outcome", String(16), nullable=False),
    Column("detail", JSON, nullable=False),
    Index("audit_by_time", "at", "id"),
)

secrets = Table(
    "secrets",
    metadata,
    Column("tenant_id", String(64), ForeignKey("tenants.id"), primary_key=True),
    Column("name", String(128), primary_key=True),
    Column("ciphertext", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("tenant_id", String(64), ForeignKey("tenants.id"), nullable=False),
    Column("state", String(16), nullable=False),
    Column("spec", JSON, nullable=False),
    Column("worker_id", String(64)),
    Column("created_at", Float, nullable=False),
    Column("last_used_at", Float, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("idle_timeout_s", Float, nullable=False),
    Column("paused_at", Float),
    Column("memory_kept", Boolean),
    Column("stopped_at", Float),
    Column("reason", String(32)),
    Column("detail", Text, nullable=False, default=""),
    Column("executions", Integer, nullable=False, default=0),
    Column("pooled", Boolean, nullable=False, default=False),  # its kernel came from a pool
    Column("sandbox_id", String(128)),  # the sandbox it runs in now (or ran in last)
    Index("sessions_by_tenant", "tenant_id", "created_at"),
    Index("sessions_by_tenant_state", "tenant_id", "state"),  # its quota counts the live ones
    Index("sessions_by_state", "state"),
)

job_stages = Table(
    "job_stages",
    metadata,
    Column("job_id", String(64), ForeignKey("jobs.id"), primary_key=True),
    Column("name", String(128), primary_key=True),
    Column("attempt", Integer, nullable=False),  # the fencing token of the committing attempt
    Column("committed_at", Float, nullable=False),
    Column("files", JSON, nullable=False),  # [{"path", "artifact_id", "sha256", "size"}]
)

job_once = Table(
    "job_once",
    metadata,
    Column("job_id", String(64), ForeignKey("jobs.id"), primary_key=True),
    Column("key", String(128), primary_key=True),
    Column("attempt", Integer, nullable=False),
    Column("recorded_at", Float, nullable=False),
)

session_cells = Table(
    "session_cells",
    metadata,
    Column("session_id", String(64), ForeignKey("sessions.id"), primary_key=True),
    Column("seq", Integer, primary_key=True),  # 1, 2, … per session; only the newest are kept
    Column("tenant_id", String(64), nullable=False),
    Column("code", Text, nullable=False),
    Column("stdout", Text, nullable=False),
    Column("stderr", Text, nullable=False),
    Column("result", Text),
    Column("display", JSON, nullable=False),  # [{"mime", "data"}], capped per cell
    Column("error", JSON),
    Column("execution_count", Integer),
    Column("timed_out", Boolean, nullable=False),
    Column("interrupted", Boolean, nullable=False),
    Column("truncated", Boolean, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("finished_at", Float, nullable=False),
    Column("duration_ms", Float, nullable=False),
)
