"""SqlStore: the Store port over SQLAlchemy Core, for SQLite and PostgreSQL alike.

Writers that race (idempotent submission, claiming) rely on the database: a primary key on
(tenant, idempotency key), and a conditional UPDATE that only one claimer can win.
"""

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, fields
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    and_,
    bindparam,
    case,
    create_engine,
    delete,
    event,
    func,
    insert,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError
from sqlalchemy.sql.dml import ReturningUpdate

from sandcell.domain.cells import SessionCell
from sandcell.domain.errors import (
    Conflict,
    IdempotencyMismatch,
    QuotaExceeded,
    StaleLease,
    StoreUnavailable,
)
from sandcell.domain.limits import Limits
from sandcell.domain.quotas import Admission
from sandcell.domain.records import (
    ApiKey,
    Artifact,
    AuditEvent,
    InputRef,
    Job,
    JobSpec,
    LogChunk,
    SecretInfo,
    StoredFile,
    Tenant,
    WorkerInfo,
)
from sandcell.domain.sessions import Session, SessionState
from sandcell.domain.states import TERMINAL_STATES, JobState, Reason
from sandcell.domain.workers import StopMode, WorkerStatus
from sandcell.store import session_cells as cell_history
from sandcell.store import worker_control
from sandcell.store.migrate import migrate
from sandcell.store.prepared import Prepared
from sandcell.store.schema import (
    api_keys,
    artifacts,
    audit_events,
    files,
    idempotency_keys,
    job_logs,
    job_once,
    job_stages,
    jobs,
    rate_buckets,
    secrets,
    sessions,
    tenants,
    workers,
)

ACTIVE = (JobState.ACCEPTED.value, JobState.RUNNING.value)
TERMINAL = tuple(sorted(state.value for state in TERMINAL_STATES))
LIVE_SESSION_STATES = ("starting", "running", "paused")
PHASES = {  # how long a job spent: waiting, becoming ready, running
    "queue": ("accepted_at", "claimed_at"),
    "start": ("claimed_at", "started_at"),
    "run": ("started_at", "finished_at"),
}


def _one_of(column: ColumnElement[str], states: Sequence[str]) -> ColumnElement[bool]:
    """`column IN (states)` with our own constant states written into the SQL: an IN of bound
    values is rendered again on every execution (~25 us of CPU here)."""
    return column.in_([literal_column(f"'{state}'") for state in states])


_IS_ACTIVE = _one_of(jobs.c.state, ACTIVE)
_IS_TERMINAL = _one_of(jobs.c.state, TERMINAL)

# The claim's statements, built once: building a statement costs more CPU than running it on
# SQLite (~0.17 ms against ~0.08 ms measured), and workers claim on every wake-up. Those every
# job runs are Prepared: run on the driver's cursor (store/prepared.py).
# A job past its `expires_at` is never claimed, even before the housekeeping that ends it.
_QUEUED = (
    select(jobs.c.id)
    .where(
        jobs.c.state == JobState.ACCEPTED.value,
        or_(jobs.c.expires_at.is_(None), jobs.c.expires_at > bindparam("now")),
    )
    .order_by(jobs.c.accepted_at)
    .limit(1)
)
# Two statements: in one (`UPDATE ... WHERE id IN (SELECT ... LIMIT n FOR UPDATE SKIP
# LOCKED)`, or `FROM` it) PostgreSQL claimed every queued job whatever the limit.
_CANDIDATES = Prepared(_QUEUED.limit(bindparam("up_to")).with_for_update(skip_locked=True))
_ANY_QUEUED = Prepared(_QUEUED)


def _claim(which: ColumnElement[bool]) -> ReturningUpdate[Any]:
    """The claim of the queued jobs `which` picks, returning them: no read after the write."""
    return (
        update(jobs)
        .where(which, jobs.c.state == JobState.ACCEPTED.value)
        .values(
            state=JobState.RUNNING.value,
            worker_id=bindparam("worker"),
            claimed_at=bindparam("now"),
            lease_expires_at=bindparam("expires"),
            fencing_token=jobs.c.fencing_token + 1,
        )
        .returning(*jobs.c)
    )


_CLAIM = _claim(jobs.c.id.in_(bindparam("jobs", expanding=True)))
# The usual claim, one job: an `IN` list is rendered again on every execution (~50 us).
_CLAIM_ONE = Prepared(_claim(jobs.c.id == bindparam("job")))
_JOB = Prepared(select(jobs).where(jobs.c.id == bindparam("job")))
_JOB_OF_TENANT = Prepared(
    select(jobs).where(jobs.c.id == bindparam("job"), jobs.c.tenant_id == bindparam("tenant"))
)
_CANCEL_REQUESTED_AT = select(jobs.c.cancel_requested_at).where(jobs.c.id == bindparam("job"))
_ENDED_AMONG = select(jobs.c.id).where(
    jobs.c.id.in_(bindparam("jobs", expanding=True)), _IS_TERMINAL
)
_CANCELS_REQUESTED = select(jobs.c.id).where(
    jobs.c.id.in_(bindparam("jobs", expanding=True)), jobs.c.cancel_requested_at.is_not(None)
)
# What every request reads (its key, its tenant; the job or session it names), built once too.
_API_KEY = select(api_keys).where(api_keys.c.id == bindparam("key"))
_TENANT = select(tenants).where(tenants.c.id == bindparam("tenant"))
_SESSION = select(sessions).where(sessions.c.id == bindparam("session"))
_SESSION_OF_TENANT = _SESSION.where(sessions.c.tenant_id == bindparam("tenant"))
_LIVE_WORKERS = select(workers).where(
    workers.c.seen_at >= bindparam("since"), workers.c.stopped_at.is_(None)
)
_LIVE_WORKER = _LIVE_WORKERS.where(workers.c.id == bindparam("worker"))
# A running job, as the attempt that holds its lease sees it: every write a worker makes about
# a job is fenced so (bound with `_owner`). Not named like the columns: an update's SET claims
# those names.
_OWNED = and_(
    jobs.c.id == bindparam("of_job"),
    jobs.c.fencing_token == bindparam("of_token"),
    jobs.c.state == JobState.RUNNING.value,
)
_OWNED_ROW = select(jobs.c.id).where(_OWNED).with_for_update()
_UPDATE_OWNED = Prepared(update(jobs).where(_OWNED), columns_from_values=True)
# The same attempt's job once it has ended: its release is recorded after the end. Built
# here, the IN's cache key is not made again on every job (0.37 -> 0.18 ms of CPU a record).
_ENDED = and_(
    jobs.c.id == bindparam("of_job"),
    jobs.c.fencing_token == bindparam("of_token"),
    _IS_TERMINAL,
)
_RECORD_RELEASE = Prepared(update(jobs).where(_ENDED), columns_from_values=True)
_LAST_LOG_SEQ = Prepared(
    select(func.max(job_logs.c.seq)).where(job_logs.c.job_id == bindparam("job"))
)
_INSERT_LOGS = Prepared(insert(job_logs), columns_from_values=True)
_INSERT_ARTIFACTS = Prepared(insert(artifacts), columns_from_values=True)
# What an admission runs on every submit.
_INSERT_JOB = Prepared(insert(jobs), columns_from_values=True)
_TENANT_LOCK = Prepared(
    select(tenants.c.stored_bytes).where(tenants.c.id == bindparam("tenant")).with_for_update()
)
_STORED_BYTES = select(tenants.c.stored_bytes).where(tenants.c.id == bindparam("tenant"))
_ADD_STORED_BYTES = Prepared(  # the parameter is not named like the column: SET claims that name
    update(tenants)
    .where(tenants.c.id == bindparam("of_tenant"))
    .values(stored_bytes=tenants.c.stored_bytes + bindparam("delta"))
)
_ACTIVE_JOBS = Prepared(
    select(func.count())
    .select_from(jobs)
    .where(jobs.c.tenant_id == bindparam("tenant"), _IS_ACTIVE)
)
_BUCKET_KEY = and_(  # not named like the columns: an update's SET claims those names
    rate_buckets.c.tenant_id == bindparam("of_tenant"),
    rate_buckets.c.bucket == bindparam("of_bucket"),
)
_BUCKET = Prepared(select(rate_buckets).where(_BUCKET_KEY).with_for_update())
_BUCKET_TAKEN = Prepared(
    update(rate_buckets)
    .where(_BUCKET_KEY)
    .values(tokens=bindparam("left"), updated_at=bindparam("at"))
)


WRITER_BEGIN = "BEGIN IMMEDIATE"  # racing writers queue for the lock instead of failing
READER_BEGIN = "BEGIN DEFERRED"  # one snapshot for a read's statements, and no lock to wait for


def prepare_sqlite(engine: Engine, begin: str = WRITER_BEGIN) -> None:
    """WAL for concurrent readers; each transaction opened with `begin`."""

    @event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # the driver's own implicit BEGINs off: ours instead
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    # The dialect's hook, not the engine's "begin" event: with any engine event listened for,
    # SQLAlchemy dispatches all of them on every statement, ~30 us of its ~130 in a read.
    def _begin(dbapi_conn: Any) -> None:
        dbapi_conn.driver_connection.execute(begin)

    engine.dialect.do_begin = _begin  # type: ignore[method-assign, assignment]


def open_sqlite(url: str) -> "SqlStore":
    """The embedded store: writes through an engine whose transactions take SQLite's write
    lock at BEGIN, reads through one whose transactions take no lock until they read."""

    def engine(begin: str) -> Engine:
        made = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        prepare_sqlite(made, begin)
        return made

    return SqlStore(engine(WRITER_BEGIN), reader=engine(READER_BEGIN))


def _spec_to_json(spec: JobSpec) -> dict[str, Any]:
    data = asdict(spec)
    data["limits"] = spec.limits.as_dict()
    return data


def _spec_from_json(data: dict[str, Any]) -> JobSpec:
    return JobSpec(
        image=data["image"],
        code=data.get("code"),
        command=data.get("command"),
        inputs=[InputRef(**item) for item in data.get("inputs", [])],
        limits=Limits(**data["limits"]),
        env=data.get("env", {}),
        network=data.get("network", {}),
        retry=data.get("retry", {}),
        secrets=data.get("secrets", []),
    )


def _job_from_row(row: Any) -> Job:
    m = _mapping(row)
    return Job(
        id=m["id"],
        tenant_id=m["tenant_id"],
        state=JobState(m["state"]),
        spec=_spec_from_json(m["spec"]),
        accepted_at=m["accepted_at"],
        expires_at=m["expires_at"],
        reason=Reason(m["reason"]) if m["reason"] else None,
        exit_code=m["exit_code"],
        detail=m["detail"] or "",
        image_digest=m["image_digest"],
        runtime=m["runtime"],
        runtime_version=m["runtime_version"],
        claimed_at=m["claimed_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        cancel_requested_at=m["cancel_requested_at"],
        retired_at=m["retired_at"],
        worker_id=m["worker_id"],
        lease_expires_at=m["lease_expires_at"],
        fencing_token=m["fencing_token"],
        usage=m["usage"] or {},
        attempts=m["attempts"] or [],
        egress=m["egress"] or [],
        pooled=bool(m["pooled"]),
        sandbox_id=m["sandbox_id"],
    )


def _mapping(row: Any) -> Mapping[str, Any]:
    """A row's values by column: an SQLAlchemy Row's, or a Prepared statement's dict."""
    return row if isinstance(row, dict) else row._mapping


def _worker_from_row(r: Any) -> WorkerInfo:
    return WorkerInfo(
        r.id, r.host, r.runtime, r.runtime_version, r.started_at, r.url, r.pools, r.health
    )


def _job_values(job: Job) -> dict[str, Any]:
    # A field at a time, not asdict: that deep-copies the spec only to drop it (~0.15 ms a
    # submit); the spec is stored as its own JSON.
    values = {f.name: getattr(job, f.name) for f in fields(job) if f.name != "spec"}
    values["spec"] = _spec_to_json(job.spec)
    values["state"] = job.state.value
    values["reason"] = job.reason.value if job.reason else None
    return values


def _tenant_from_row(row: Any) -> Tenant:
    values = dict(row._mapping)
    values["quotas"] = values.get("quotas") or {}
    del values["stored_bytes"]  # the store's own bookkeeping: read by admission and quotas
    return Tenant(**values)


def _artifacts_where(which: ColumnElement[bool]) -> Select[Any]:
    return select(artifacts).where(which).order_by(artifacts.c.path)


def _stages_where(which: ColumnElement[bool]) -> Select[Any]:
    return select(job_stages).where(which).order_by(job_stages.c.committed_at)


# A job's outputs and stages (or a page of jobs'), read for every record rendered; built once,
# the list of ids bound at each run ("expanding").
_ARTIFACTS_OF = _artifacts_where(artifacts.c.job_id.in_(bindparam("jobs", expanding=True)))
_STAGES_OF = _stages_where(job_stages.c.job_id.in_(bindparam("jobs", expanding=True)))
# The same for one job, as every wait for a job's end reads it: an expanding IN is rendered
# again on every execution, which cost more CPU than the query.
_ARTIFACTS_OF_JOB = Prepared(_artifacts_where(artifacts.c.job_id == bindparam("job")))
_STAGES_OF_JOB = Prepared(_stages_where(job_stages.c.job_id == bindparam("job")))


def _outputs_of(
    conn: Connection, job_ids: list[str]
) -> dict[str, tuple[list[Artifact], list[dict[str, Any]]]]:
    found: dict[str, tuple[list[Artifact], list[dict[str, Any]]]] = {
        job_id: ([], []) for job_id in job_ids
    }
    artifact_rows: Iterable[Any]
    stage_rows: Iterable[Any]
    if len(job_ids) == 1:
        one = {"job": job_ids[0]}
        artifact_rows, stage_rows = (
            _ARTIFACTS_OF_JOB.rows(conn, one),
            _STAGES_OF_JOB.rows(conn, one),
        )
    else:
        many = {"jobs": job_ids}
        artifact_rows, stage_rows = (
            conn.execute(_ARTIFACTS_OF, many),
            conn.execute(_STAGES_OF, many),
        )
    for row in artifact_rows:
        found[_mapping(row)["job_id"]][0].append(_artifact_from_row(row))
    for row in stage_rows:
        found[_mapping(row)["job_id"]][1].append(_stage_from_row(row))
    return found


def _stage_from_row(row: Any) -> dict[str, Any]:
    m = _mapping(row)
    return {
        "name": m["name"],
        "attempt": m["attempt"],
        "committed_at": m["committed_at"],
        "files": m["files"],
    }


def _artifact_from_row(row: Any) -> Artifact:
    return Artifact(**_mapping(row))


def _after_lost_worker(job: Job, now: float) -> dict[str, Any]:
    attempt = {
        "number": job.fencing_token,
        "worker_id": job.worker_id,
        "claimed_at": job.claimed_at,
        "started_at": job.started_at,
        "finished_at": now,
        "state": JobState.FAILED.value,
        "reason": Reason.WORKER_LOST.value,
        "sandbox_id": job.sandbox_id,  # None if it never got as far as its ready line
    }
    attempts = [*job.attempts, attempt]
    values: dict[str, Any] = {"attempts": attempts, "fencing_token": job.fencing_token + 1}
    if len(attempts) < int(job.spec.retry.get("max_attempts", 1)):
        return values | {
            "state": JobState.ACCEPTED.value,
            "worker_id": None,
            "lease_expires_at": None,
            "started_at": None,
            "sandbox_id": None,
        }
    return values | {
        "state": JobState.FAILED.value,
        "reason": Reason.WORKER_LOST.value,
        "detail": "the worker running this job stopped renewing its lease",
        "finished_at": now,
    }


def _admit(conn: Connection, tenant_id: str, admission: Admission) -> None:
    """Quota and rate checks, serialised per tenant by a row lock (SQLite: the write lock)."""
    quotas, tenant = admission.quotas, {"tenant": tenant_id}
    stored_bytes = _TENANT_LOCK.scalar(conn, tenant) or 0
    active = _ACTIVE_JOBS.scalar(conn, tenant)
    if active >= quotas.concurrent_jobs:
        raise QuotaExceeded(f"{active} jobs are already queued or running (quota)", 1)
    if stored_bytes >= quotas.storage_mb * 2**20:
        raise QuotaExceeded("storage quota used up: delete files or retire jobs", 60)
    _take_token(conn, tenant_id, "jobs", quotas.jobs_per_minute, quotas.burst, admission.now)


def _count_stored(conn: Connection, tenant_id: str, delta: int) -> None:
    """Files or artifacts of `delta` bytes were added (or, negative, removed) in this
    transaction: the tenant's stored_bytes says so from the same commit."""
    if delta:
        _ADD_STORED_BYTES.write(conn, {"of_tenant": tenant_id, "delta": delta})


def _take_token(
    conn: Connection, tenant_id: str, bucket: str, per_minute: float, burst: int, now: float
) -> None:
    """A token bucket kept in the store, so limits hold across replicas and restarts."""
    key = {"of_tenant": tenant_id, "of_bucket": bucket}
    row = _BUCKET.first(conn, key)
    tokens = float(burst) if row is None else row["tokens"]
    if row is not None:
        tokens = min(float(burst), tokens + (now - row["updated_at"]) * per_minute / 60)
    if tokens < 1:
        raise QuotaExceeded(
            "submission rate limit reached", math.ceil((1 - tokens) * 60 / per_minute)
        )
    if row is None:
        conn.execute(
            insert(rate_buckets).values(
                tenant_id=tenant_id, bucket=bucket, tokens=tokens - 1, updated_at=now
            )
        )
    else:
        _BUCKET_TAKEN.write(conn, key | {"left": tokens - 1, "at": now})


def _owner(job_id: str, token: int) -> dict[str, Any]:
    """The values `_OWNED` is bound to for the attempt `token` of `job_id`."""
    return {"of_job": job_id, "of_token": token}


def _insert_logs(conn: Connection, job_id: str, chunks: Sequence[tuple[str, bytes]]) -> None:
    """Append log chunks after the job's last one, in order."""
    last = _LAST_LOG_SEQ.scalar(conn, {"job": job_id})
    first = 0 if last is None else last + 1
    rows = [
        {"job_id": job_id, "seq": first + n, "stream": stream, "data": data}
        for n, (stream, data) in enumerate(chunks)
    ]
    _INSERT_LOGS.write_many(conn, rows)


def _insert_artifacts(conn: Connection, job_id: str, found: Sequence[Artifact]) -> None:
    """Record artifacts of `job_id` (none: nothing to do)."""
    if found:
        assert all(a.job_id == job_id for a in found)
        _INSERT_ARTIFACTS.write_many(conn, [asdict(a) for a in found])
        for tenant_id in {a.tenant_id for a in found}:
            _count_stored(conn, tenant_id, sum(a.size for a in found if a.tenant_id == tenant_id))


def _session_from_row(row: Any) -> Session:
    values = dict(row._mapping)
    values["state"] = SessionState(values["state"])
    values["detail"] = values.get("detail") or ""
    return Session(**values)


@contextmanager
def _reachable() -> Iterator[None]:
    """A lost or refused database connection is StoreUnavailable: callers may retry it.

    The transaction was rolled back (or never began), except in the one case no client can
    tell apart: the connection died after the server committed. A retried write may therefore
    apply twice; retry only writes for which that is harmless (fenced or idempotent). The
    cause (host, port) stays in the chained exception, out of what API clients see.
    """
    try:
        yield
    except (OperationalError, InterfaceError) as exc:
        raise StoreUnavailable() from exc


class SqlStore:
    def __init__(self, engine: Engine, reader: Engine | None = None) -> None:
        self.engine = engine
        self.reader = reader or engine  # PostgreSQL: one engine; its reads lock nothing anyway

    def create_schema(self) -> None:
        migrate(self.engine)

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        with _reachable(), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with _reachable(), self.reader.begin() as conn:
            yield conn

    def _any(self, condition: ColumnElement[bool], column: ColumnElement[Any]) -> bool:
        """Whether a row matches, looked at outside any write. Housekeeping asks every second
        and nearly always finds nothing: on SQLite a write transaction to find that out would
        queue behind every other writer (and hold the API's writes up behind it)."""
        with self._read() as conn:
            return conn.execute(select(column).where(condition).limit(1)).first() is not None

    # tenants and keys

    def add_tenant(self, tenant: Tenant) -> None:
        try:
            with self._tx() as conn:
                conn.execute(insert(tenants).values(**asdict(tenant)))
        except IntegrityError as exc:
            raise Conflict(f"a tenant named {tenant.name!r} already exists") from exc

    def get_tenant(self, tenant_id: str) -> Tenant | None:
        with self._read() as conn:
            row = conn.execute(_TENANT, {"tenant": tenant_id}).first()
        return _tenant_from_row(row) if row else None

    def patch_tenant_quotas(self, tenant_id: str, changes: dict[str, Any]) -> Tenant | None:
        """Set the quotas in `changes`; a None value drops that override (back to default)."""
        with self._tx() as conn:
            row = conn.execute(
                select(tenants.c.quotas).where(tenants.c.id == tenant_id).with_for_update()
            ).first()
            if row is None:
                return None
            quotas = {k: v for k, v in ({**(row.quotas or {}), **changes}).items() if v is not None}
            conn.execute(update(tenants).where(tenants.c.id == tenant_id).values(quotas=quotas))
            found = conn.execute(select(tenants).where(tenants.c.id == tenant_id)).one()
        return _tenant_from_row(found)

    def add_api_key(self, key: ApiKey, key_hash: str) -> None:
        with self._tx() as conn:
            conn.execute(insert(api_keys).values(**asdict(key), key_hash=key_hash))

    def get_api_key(self, key_id: str) -> tuple[ApiKey, str] | None:
        with self._read() as conn:
            row = conn.execute(_API_KEY, {"key": key_id}).first()
        if row is None:
            return None
        values = dict(row._mapping)
        key_hash = values.pop("key_hash")
        return ApiKey(**values), key_hash

    def revoke_api_key(self, key_id: str, at: float) -> bool:
        with self._tx() as conn:
            result = conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=at)
            )
        return result.rowcount == 1

    def revoked_key_ids(self, since: float) -> list[str]:
        query = select(api_keys.c.id).where(api_keys.c.revoked_at >= since)
        with self._read() as conn:
            return list(conn.execute(query).scalars())

    # input files

    def add_file(self, stored: StoredFile) -> None:
        with self._tx() as conn:
            conn.execute(insert(files).values(**asdict(stored)))
            _count_stored(conn, stored.tenant_id, stored.size)

    def get_file(self, tenant_id: str, file_id: str) -> StoredFile | None:
        with self._read() as conn:
            row = conn.execute(
                select(files).where(files.c.id == file_id, files.c.tenant_id == tenant_id)
            ).first()
        return StoredFile(**dict(row._mapping)) if row else None

    def delete_file(self, tenant_id: str, file_id: str) -> bool:
        owned = and_(files.c.id == file_id, files.c.tenant_id == tenant_id)
        with self._tx() as conn:
            # RETURNING: what this very delete removed (a concurrent one may have been first)
            size = conn.execute(delete(files).where(owned).returning(files.c.size)).scalar()
            if size is None:
                return False
            _count_stored(conn, tenant_id, -size)
        return True

    # jobs, seen by the API

    def add_job(
        self, job: Job, idempotency: tuple[str, str] | None, admission: Admission | None = None
    ) -> Job:
        if idempotency and (replay := self._job_under_key(job.tenant_id, *idempotency)):
            return replay  # a replay is answered before quotas: it creates nothing
        try:
            with self._tx() as conn:
                if admission:
                    _admit(conn, job.tenant_id, admission)
                _INSERT_JOB.write(conn, _job_values(job))
                if idempotency:
                    key, body_sha256 = idempotency
                    conn.execute(
                        insert(idempotency_keys).values(
                            tenant_id=job.tenant_id,
                            key=key,
                            body_sha256=body_sha256,
                            job_id=job.id,
                            created_at=job.accepted_at,
                        )
                    )
            return job
        except IntegrityError:
            if idempotency is None:
                raise
        replay = self._job_under_key(job.tenant_id, *idempotency)
        assert replay is not None, "the key that collided must exist"
        return replay

    def _job_under_key(self, tenant_id: str, key: str, body_sha256: str) -> Job | None:
        with self._read() as conn:
            row = conn.execute(
                select(idempotency_keys).where(
                    idempotency_keys.c.tenant_id == tenant_id, idempotency_keys.c.key == key
                )
            ).first()
            if row is None:
                return None
            if row.body_sha256 != body_sha256:
                raise IdempotencyMismatch()
            job_row = _JOB.first(conn, {"job": row.job_id})
        assert job_row is not None, "a key names the job it made"
        return _job_from_row(job_row)

    def get_job(self, tenant_id: str | None, job_id: str) -> Job | None:
        query = _JOB if tenant_id is None else _JOB_OF_TENANT
        with self._read() as conn:
            row = query.first(conn, {"job": job_id, "tenant": tenant_id})
        return _job_from_row(row) if row else None

    def list_jobs(
        self, tenant_id: str, state: JobState | None, after: tuple[float, str] | None, limit: int
    ) -> list[Job]:
        query = select(jobs).where(jobs.c.tenant_id == tenant_id)
        if state is not None:
            query = query.where(jobs.c.state == state.value)
        if after is not None:
            at, job_id = after
            query = query.where(
                or_(jobs.c.accepted_at < at, and_(jobs.c.accepted_at == at, jobs.c.id < job_id))
            )
        query = query.order_by(jobs.c.accepted_at.desc(), jobs.c.id.desc()).limit(limit)
        with self._read() as conn:
            return [_job_from_row(row) for row in conn.execute(query)]

    def request_cancel(self, tenant_id: str, job_id: str, at: float) -> Job | None:
        mine = and_(jobs.c.id == job_id, jobs.c.tenant_id == tenant_id)
        with self._tx() as conn:
            conn.execute(
                update(jobs)
                .where(mine, jobs.c.state == JobState.ACCEPTED.value)
                .values(
                    state=JobState.CANCELLED.value,
                    reason=Reason.CANCELLED.value,
                    detail="cancelled before it started",
                    cancel_requested_at=at,
                    finished_at=at,
                )
            )
            conn.execute(
                update(jobs)
                .where(mine, jobs.c.state == JobState.RUNNING.value)
                .where(jobs.c.cancel_requested_at.is_(None))
                .values(cancel_requested_at=at)
            )
            row = conn.execute(select(jobs).where(mine)).first()
        return _job_from_row(row) if row else None

    def retire_job(self, tenant_id: str, job_id: str, at: float) -> Job | None:
        mine = and_(jobs.c.id == job_id, jobs.c.tenant_id == tenant_id)
        with self._tx() as conn:
            row = conn.execute(select(jobs).where(mine)).first()
            if row is None:
                return None
            job = _job_from_row(row)
            if job.state.is_terminal and job.retired_at is None:
                # The tombstone keeps state and timing; the code and environment go.
                spec = _spec_to_json(job.spec) | {"code": None, "command": None, "env": {}}
                conn.execute(update(jobs).where(mine).values(retired_at=at, spec=spec))
        return job

    def purge_idempotency_keys(self, older_than: float) -> int:
        old = idempotency_keys.c.created_at < older_than
        if not self._any(old, idempotency_keys.c.created_at):
            return 0
        with self._tx() as conn:
            result = conn.execute(delete(idempotency_keys).where(old))
        return result.rowcount

    # jobs, seen by a worker

    def claim_next(self, worker_id: str, now: float, lease_s: float) -> Job | None:
        return next(iter(self.claim_jobs(worker_id, now, lease_s, 1)), None)

    def claim_jobs(
        self, worker_id: str, now: float, lease_s: float, up_to: int, look_first: bool = True
    ) -> list[Job]:
        # A look first, outside any write: a claim after a wake-up may find nothing, and on
        # SQLite a write transaction queues behind every other writer.
        if look_first:
            with self._read() as conn:
                if _ANY_QUEUED.first(conn, {"now": now}) is None:
                    return []
        with self._tx() as conn:
            ids = [row["id"] for row in _CANDIDATES.rows(conn, {"now": now, "up_to": up_to})]
            if not ids:
                return []
            claimed = {"worker": worker_id, "now": now, "expires": now + lease_s}
            rows: Sequence[Any]
            if len(ids) == 1:
                rows = _CLAIM_ONE.rows(conn, claimed | {"job": ids[0]})
            else:
                rows = conn.execute(_CLAIM, claimed | {"jobs": ids}).all()
        return sorted(map(_job_from_row, rows), key=lambda job: job.accepted_at)

    def expire_unstarted(self, now: float) -> list[str]:
        due = and_(
            jobs.c.state == JobState.ACCEPTED.value,
            jobs.c.expires_at.is_not(None),
            jobs.c.expires_at <= now,
        )
        if not self._any(due, jobs.c.id):
            return []
        with self._tx() as conn:
            ids = list(conn.execute(select(jobs.c.id).where(due)).scalars())
            conn.execute(
                update(jobs)
                .where(due)
                .values(
                    state=JobState.FAILED.value,
                    reason=Reason.EXPIRED.value,
                    detail="not started before expires_in_s ran out",
                    finished_at=now,
                )
            )
        return ids

    def _require_owner(self, conn: Connection, job_id: str, token: int) -> None:
        """Every write a worker makes about a job first proves it still holds the lease.

        The job row stays locked until the write commits, so a settler (fail_lost_jobs, a
        re-claim) cannot change the token in between: on PostgreSQL by FOR UPDATE, which
        also re-reads a row that a concurrent settler just committed; on SQLite by the write
        lock that BEGIN IMMEDIATE (prepare_sqlite) takes before this check.
        """
        if conn.execute(_OWNED_ROW, _owner(job_id, token)).first() is None:
            raise StaleLease()

    def renew_lease(self, job_id: str, token: int, now: float, lease_s: float) -> bool:
        with self._tx() as conn:
            expires = {"lease_expires_at": now + lease_s}
            return _UPDATE_OWNED.write(conn, expires | _owner(job_id, token)) == 1

    def cancel_requested(self, job_id: str) -> bool:
        with self._read() as conn:
            at = conn.execute(_CANCEL_REQUESTED_AT, {"job": job_id}).scalar()
        return at is not None

    def ended_among(self, job_ids: list[str]) -> set[str]:
        with self._read() as conn:
            return set(conn.execute(_ENDED_AMONG, {"jobs": job_ids}).scalars())

    def cancels_requested(self, job_ids: list[str]) -> set[str]:
        with self._read() as conn:
            return set(conn.execute(_CANCELS_REQUESTED, {"jobs": job_ids}).scalars())

    def mark_started(
        self, job_id: str, token: int, at: float, image_digest: str, sandbox_id: str
    ) -> None:
        with self._tx() as conn:
            started = {"started_at": at, "image_digest": image_digest, "sandbox_id": sandbox_id}
            changed = _UPDATE_OWNED.write(conn, started | _owner(job_id, token))
        if changed != 1:
            raise StaleLease()

    def append_log(self, job_id: str, token: int, stream: str, data: bytes) -> None:
        with self._tx() as conn:
            self._require_owner(conn, job_id, token)
            _insert_logs(conn, job_id, [(stream, data)])

    def add_artifact(self, artifact: Artifact, token: int) -> None:
        self.add_artifacts(artifact.job_id, [artifact], token)

    def add_artifacts(self, job_id: str, found: list[Artifact], token: int) -> None:
        """All of them or none: a job's outputs appear together."""
        with self._tx() as conn:
            self._require_owner(conn, job_id, token)
            _insert_artifacts(conn, job_id, found)

    def finish_job(
        self,
        job: Job,
        token: int,
        logs: Sequence[tuple[str, bytes]] = (),
        outputs: Sequence[Artifact] = (),
    ) -> None:
        assert (job.state.is_terminal and job.reason is not None) or job.state is JobState.COMPLETED
        values = {
            "state": job.state.value,
            "reason": job.reason.value if job.reason else None,
            "exit_code": job.exit_code,
            "detail": job.detail,
            "runtime": job.runtime,
            "runtime_version": job.runtime_version,
            "started_at": job.started_at,
            "image_digest": job.image_digest,
            "finished_at": job.finished_at,
            "usage": job.usage,
            "attempts": job.attempts,
            "egress": job.egress,
            "pooled": job.pooled,
            "sandbox_id": job.sandbox_id,
            "lease_expires_at": None,
        }
        with self._tx() as conn:
            if _UPDATE_OWNED.write(conn, values | _owner(job.id, token)) != 1:
                raise StaleLease()  # inside: nothing of this end is written
            if logs:
                _insert_logs(conn, job.id, logs)
            _insert_artifacts(conn, job.id, outputs)

    def record_release(
        self, job_id: str, token: int, usage: dict[str, float], detail: str | None
    ) -> None:
        values: dict[str, Any] = {"usage": usage} | ({"detail": detail} if detail else {})
        with self._tx() as conn:  # one write, no read: the worker knows the usage it ended with
            _RECORD_RELEASE.write(conn, values | _owner(job_id, token))

    def fail_lost_jobs(self, now: float) -> list[str]:
        """Settle jobs whose lease ran out: re-queue those with attempts left, fail the rest."""
        lost = and_(jobs.c.state == JobState.RUNNING.value, jobs.c.lease_expires_at < now)
        if not self._any(lost, jobs.c.id):
            return []
        with self._tx() as conn:
            rows = conn.execute(select(jobs).where(lost).with_for_update(skip_locked=True)).all()
            for row in rows:
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id == row.id, jobs.c.fencing_token == row.fencing_token)
                    .values(**_after_lost_worker(_job_from_row(row), now))
                )
        return [row.id for row in rows]

    def release_job(self, job_id: str, token: int, now: float) -> None:
        """The owner gives a running job up (shutting down): settle it like a lost one."""
        with self._tx() as conn:
            owner = _owner(job_id, token)
            row = conn.execute(select(jobs).where(_OWNED).with_for_update(), owner).first()
            if row is None:
                raise StaleLease()
            values = _after_lost_worker(_job_from_row(row), now)
            values["detail"] = "the worker stopped before the job finished"
            conn.execute(update(jobs).where(_OWNED).values(**values), owner)

    def fail_job(
        self, job_id: str, reason: Reason, detail: str, at: float, token: int | None = None
    ) -> None:
        fenced = [] if token is None else [jobs.c.fencing_token == token]
        with self._tx() as conn:
            failed = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, _IS_ACTIVE, *fenced)
                .values(
                    state=reason.state.value,
                    reason=reason.value,
                    detail=detail,
                    finished_at=at,
                    fencing_token=jobs.c.fencing_token + 1,
                )
            )
            if token is not None and failed.rowcount == 0:
                raise StaleLease()  # ended, or another worker's now: not this one's to fail

    # logs and artifacts, seen by the API

    def read_logs(self, job_id: str, after_seq: int) -> list[LogChunk]:
        query = (
            select(job_logs.c.seq, job_logs.c.stream, job_logs.c.data)
            .where(job_logs.c.job_id == job_id, job_logs.c.seq > after_seq)
            .order_by(job_logs.c.seq)
        )
        with self._read() as conn:
            return [LogChunk(seq=r.seq, stream=r.stream, data=r.data) for r in conn.execute(query)]

    def list_artifacts(self, job_id: str) -> list[Artifact]:
        with self._read() as conn:
            return [
                _artifact_from_row(row) for row in _ARTIFACTS_OF_JOB.rows(conn, {"job": job_id})
            ]

    def get_artifact(self, tenant_id: str | None, artifact_id: str) -> Artifact | None:
        query = select(artifacts).where(artifacts.c.id == artifact_id)
        if tenant_id is not None:
            query = query.where(artifacts.c.tenant_id == tenant_id)
        with self._read() as conn:
            row = conn.execute(query).first()
        return _artifact_from_row(row) if row else None

    def delete_job_data(self, job_id: str) -> tuple[list[Artifact], int]:
        with self._tx() as conn:
            removed = [
                _artifact_from_row(r)
                for r in conn.execute(select(artifacts).where(artifacts.c.job_id == job_id))
            ]
            log_bytes = conn.execute(
                select(func.coalesce(func.sum(func.length(job_logs.c.data)), 0)).where(
                    job_logs.c.job_id == job_id
                )
            ).scalar()
            conn.execute(delete(job_stages).where(job_stages.c.job_id == job_id))
            conn.execute(delete(job_once).where(job_once.c.job_id == job_id))
            gone = conn.execute(
                delete(artifacts)
                .where(artifacts.c.job_id == job_id)
                .returning(artifacts.c.tenant_id, artifacts.c.size)
            ).all()
            for tenant_id in {tenant for tenant, _ in gone}:
                _count_stored(conn, tenant_id, -sum(size for t, size in gone if t == tenant_id))
            conn.execute(delete(job_logs).where(job_logs.c.job_id == job_id))
        return removed, int(log_bytes or 0)

    def sha256_in_use(self, sha256: str) -> bool:
        with self._read() as conn:
            in_artifacts = conn.execute(
                select(artifacts.c.id).where(artifacts.c.sha256 == sha256).limit(1)
            ).first()
            in_files = conn.execute(
                select(files.c.id).where(files.c.sha256 == sha256).limit(1)
            ).first()
        return in_artifacts is not None or in_files is not None

    # workers

    def worker_seen(self, worker: WorkerInfo, at: float) -> None:
        with self._tx() as conn:
            result = conn.execute(
                update(workers)
                .where(workers.c.id == worker.id)
                .values(seen_at=at, url=worker.url, pools=worker.pools, health=worker.health)
            )
            if result.rowcount == 0:
                conn.execute(insert(workers).values(**asdict(worker), seen_at=at))

    def worker_stopped(self, worker_id: str, at: float) -> None:
        with self._tx() as conn:
            conn.execute(update(workers).where(workers.c.id == worker_id).values(stopped_at=at))

    def live_workers(self, seen_since: float) -> list[WorkerInfo]:
        with self._read() as conn:
            return [_worker_from_row(r) for r in conn.execute(_LIVE_WORKERS, {"since": seen_since})]

    def live_worker(self, worker_id: str, seen_since: float) -> WorkerInfo | None:
        """One worker, if it is live: what a session's every call reads to reach its worker,
        at the cost of one row however many workers there are."""
        with self._read() as conn:
            row = conn.execute(_LIVE_WORKER, {"since": seen_since, "worker": worker_id}).first()
        return None if row is None else _worker_from_row(row)

    def request_worker_stop(self, worker_id: str, mode: StopMode, at: float) -> None:
        with self._tx() as conn:
            worker_control.request_stop(conn, worker_id, mode, at)

    def worker_stop_request(self, worker_id: str) -> StopMode | None:
        with self._read() as conn:
            return worker_control.stop_request(conn, worker_id)

    def list_workers(
        self, include_stopped: bool, limit: int, worker_id: str | None = None
    ) -> list[WorkerStatus]:
        with self._read() as conn:
            return worker_control.list_workers(conn, include_stopped, limit, worker_id)

    def storage_bytes(self, tenant_id: str) -> int:
        with self._read() as conn:
            return int(conn.execute(_STORED_BYTES, {"tenant": tenant_id}).scalar() or 0)

    # secrets (values arrive and leave encrypted; the store never sees plaintext)

    def put_secret(self, tenant_id: str, name: str, ciphertext: bytes, at: float) -> SecretInfo:
        key = and_(secrets.c.tenant_id == tenant_id, secrets.c.name == name)
        with self._tx() as conn:
            row = conn.execute(select(secrets.c.created_at).where(key)).first()
            if row is None:
                conn.execute(
                    insert(secrets).values(
                        tenant_id=tenant_id,
                        name=name,
                        ciphertext=ciphertext,
                        created_at=at,
                        updated_at=at,
                    )
                )
                return SecretInfo(name, at, at)
            conn.execute(update(secrets).where(key).values(ciphertext=ciphertext, updated_at=at))
        return SecretInfo(name, row.created_at, at)

    def list_secrets(self, tenant_id: str) -> list[SecretInfo]:
        query = (
            select(secrets.c.name, secrets.c.created_at, secrets.c.updated_at)
            .where(secrets.c.tenant_id == tenant_id)
            .order_by(secrets.c.name)
        )
        with self._read() as conn:
            return [SecretInfo(r.name, r.created_at, r.updated_at) for r in conn.execute(query)]

    def secret_ciphertexts(self, tenant_id: str, names: list[str]) -> dict[str, bytes]:
        query = select(secrets.c.name, secrets.c.ciphertext).where(
            secrets.c.tenant_id == tenant_id, secrets.c.name.in_(names)
        )
        with self._read() as conn:
            return {r.name: r.ciphertext for r in conn.execute(query)}

    def delete_secret(self, tenant_id: str, name: str) -> bool:
        with self._tx() as conn:
            result = conn.execute(
                delete(secrets).where(secrets.c.tenant_id == tenant_id, secrets.c.name == name)
            )
        return result.rowcount == 1

    # stages and once-blocks (guest progress, written under the attempt's fencing token)

    def commit_stage(
        self, job_id: str, token: int, name: str, stored: list[Artifact], at: float
    ) -> list[dict[str, Any]]:
        """The stage's artifacts and its row in one transaction: all of it, or nothing."""
        files = [
            {"path": a.path, "artifact_id": a.id, "sha256": a.sha256, "size": a.size}
            for a in stored
        ]
        with self._tx() as conn:
            self._require_owner(conn, job_id, token)
            key = and_(job_stages.c.job_id == job_id, job_stages.c.name == name)
            if conn.execute(select(job_stages.c.name).where(key)).first() is not None:
                raise Conflict(f"stage {name!r} is already committed")
            _insert_artifacts(conn, job_id, stored)
            conn.execute(
                insert(job_stages).values(
                    job_id=job_id, name=name, attempt=token, committed_at=at, files=files
                )
            )
        return files

    def record_once(self, job_id: str, token: int, key: str, at: float) -> bool:
        """True if `key` is new (run the block), False if an earlier attempt recorded it."""
        with self._tx() as conn:
            self._require_owner(conn, job_id, token)
            where = and_(job_once.c.job_id == job_id, job_once.c.key == key)
            if conn.execute(select(job_once.c.key).where(where)).first() is not None:
                return False
            conn.execute(
                insert(job_once).values(job_id=job_id, key=key, attempt=token, recorded_at=at)
            )
        return True

    def job_stages(self, job_id: str) -> list[dict[str, Any]]:
        with self._read() as conn:
            return [_stage_from_row(row) for row in _STAGES_OF_JOB.rows(conn, {"job": job_id})]

    def outputs_of(
        self, job_ids: list[str]
    ) -> dict[str, tuple[list[Artifact], list[dict[str, Any]]]]:
        if not job_ids:
            return {}
        with self._read() as conn:
            return _outputs_of(conn, job_ids)

    def job_with_outputs(
        self, tenant_id: str | None, job_id: str
    ) -> tuple[Job, list[Artifact], list[dict[str, Any]]] | None:
        query = _JOB if tenant_id is None else _JOB_OF_TENANT
        with self._read() as conn:
            row = query.first(conn, {"job": job_id, "tenant": tenant_id})
            if row is None:
                return None
            outputs, stages = _outputs_of(conn, [job_id])[job_id]
        return _job_from_row(row), outputs, stages

    def once_keys(self, job_id: str) -> list[str]:
        query = select(job_once.c.key).where(job_once.c.job_id == job_id)
        with self._read() as conn:
            return list(conn.execute(query).scalars())

    # sessions

    def add_session(self, session: Session) -> None:
        values = {k: v for k, v in asdict(session).items() if k != "extra"}
        values["state"] = session.state.value
        with self._tx() as conn:
            conn.execute(insert(sessions).values(**values))

    def get_session(self, tenant_id: str | None, session_id: str) -> Session | None:
        query = _SESSION if tenant_id is None else _SESSION_OF_TENANT
        with self._read() as conn:
            row = conn.execute(query, {"session": session_id, "tenant": tenant_id}).first()
        return _session_from_row(row) if row else None

    def update_session(self, session_id: str, **values: Any) -> None:
        if isinstance(values.get("state"), SessionState):
            values["state"] = values["state"].value
        with self._tx() as conn:
            conn.execute(update(sessions).where(sessions.c.id == session_id).values(**values))

    def list_sessions(self, tenant_id: str, live_only: bool, limit: int) -> list[Session]:
        query = select(sessions).where(sessions.c.tenant_id == tenant_id)
        if live_only:
            query = query.where(sessions.c.state.in_(LIVE_SESSION_STATES))
        query = query.order_by(sessions.c.created_at.desc()).limit(limit)
        with self._read() as conn:
            return [_session_from_row(row) for row in conn.execute(query)]

    def sessions_of_worker(self, worker_id: str, states: list[SessionState]) -> list[Session]:
        query = select(sessions).where(
            sessions.c.worker_id == worker_id, sessions.c.state.in_([s.value for s in states])
        )
        with self._read() as conn:
            return [_session_from_row(row) for row in conn.execute(query)]

    def fail_orphan_sessions(self, live_worker_ids: list[str], now: float) -> list[str]:
        """Running sessions whose worker is gone lost their sandbox with it."""
        orphaned = and_(
            sessions.c.state.in_(("starting", "running")),
            sessions.c.worker_id.not_in(live_worker_ids) if live_worker_ids else true(),
        )
        if not self._any(orphaned, sessions.c.id):
            return []
        with self._tx() as conn:
            ids = list(conn.execute(select(sessions.c.id).where(orphaned)).scalars())
            conn.execute(
                update(sessions)
                .where(sessions.c.id.in_(ids))
                .values(
                    state=SessionState.FAILED.value,
                    reason="worker_lost",
                    detail="the worker holding this session stopped",
                    stopped_at=now,
                )
            )
        return ids

    def add_session_cell(self, cell: SessionCell, keep: int) -> SessionCell:
        with self._tx() as conn:
            return cell_history.add(conn, cell, keep)

    def session_cells(
        self, tenant_id: str, session_id: str, after: int | None, limit: int
    ) -> list[SessionCell]:
        with self._read() as conn:
            return cell_history.listed(conn, tenant_id, session_id, after, limit)

    def count_live_sessions(self, tenant_id: str) -> int:
        query = select(func.count()).where(
            sessions.c.tenant_id == tenant_id, sessions.c.state.in_(LIVE_SESSION_STATES)
        )
        with self._read() as conn:
            return int(conn.execute(query).scalar_one())

    # audit

    def audit(self, event: AuditEvent) -> None:
        with self._tx() as conn:
            conn.execute(insert(audit_events).values(**asdict(event)))

    def audit_events(
        self, tenant_id: str | None, action: str | None, before: float | None, limit: int
    ) -> list[AuditEvent]:
        query = select(audit_events)
        if tenant_id is not None:
            query = query.where(audit_events.c.tenant_id == tenant_id)
        if action is not None:
            query = query.where(audit_events.c.action == action)
        if before is not None:
            query = query.where(audit_events.c.at < before)
        query = query.order_by(audit_events.c.at.desc(), audit_events.c.id.desc()).limit(limit)
        with self._read() as conn:
            return [AuditEvent(**dict(row._mapping)) for row in conn.execute(query)]

    # metrics

    def job_counts(self) -> dict[tuple[str, str], int]:
        query = select(jobs.c.state, jobs.c.reason, func.count()).group_by(
            jobs.c.state, jobs.c.reason
        )
        with self._read() as conn:
            return {(r[0], r[1] or ""): int(r[2]) for r in conn.execute(query)}

    def phase_histogram(self, phase: str, bounds_s: list[float]) -> tuple[list[int], float, int]:
        """Cumulative bucket counts, sum and count of one job phase over all jobs that had it."""
        start, end = PHASES[phase]
        took = jobs.c[end] - jobs.c[start]
        had = and_(jobs.c[start].is_not(None), jobs.c[end].is_not(None))
        columns = [func.sum(case((took <= bound, 1), else_=0)) for bound in bounds_s]
        query = select(*columns, func.coalesce(func.sum(took), 0.0), func.count()).where(had)
        with self._read() as conn:
            row = conn.execute(query).one()
        *buckets, total, count = row
        return [int(b or 0) for b in buckets], float(total), int(count)

    def ping(self) -> None:
        with self._read() as conn:
            conn.execute(select(1))
