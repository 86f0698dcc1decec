"""A submission's store transaction (admission + insert) for a tenant with a long history,
against the same tenant fresh, on SQLite and PostgreSQL.

    .venv/bin/python -m bench.admission [--history 100000] [--runs 200]

Admission checks the tenant's active jobs and stored bytes in the transaction that records the
job. It used to count those over the tenant's whole history (every past job, every artifact of
every tenant), so a submit slowed down as the deployment aged; the ratio shows it does not.
The history (finished jobs, each with an artifact) is inserted with plain SQL, as it would be
after months of use; PostgreSQL runs in a scratch schema of the `test` database.
"""

import argparse
import json
import secrets
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, text

from bench._baselines import summary, timed
from sandcell.domain.ids import new_id
from sandcell.domain.limits import Limits
from sandcell.domain.quotas import Admission, Quotas
from sandcell.domain.records import Job, JobSpec, Tenant
from sandcell.domain.states import JobState
from sandcell.store.sql import SqlStore, prepare_sqlite

PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
QUOTAS = Quotas(concurrent_jobs=10**6, jobs_per_minute=10**9, burst=10**9)
ARTIFACT_BYTES = 1000


@contextmanager
def sqlite_engine() -> Iterator[Engine]:
    with tempfile.TemporaryDirectory() as scratch:
        engine = create_engine(f"sqlite:///{Path(scratch) / 'bench.db'}")
        prepare_sqlite(engine)
        yield engine
        engine.dispose()


@contextmanager
def postgres_engine() -> Iterator[Engine]:
    schema = f"sc_bench_{secrets.token_hex(4)}"
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    engine = create_engine(PG_URL, connect_args={"options": f"-csearch_path={schema}"})
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


def submit(store: SqlStore, tenant: Tenant) -> None:
    spec = JobSpec("python", "print(1)", None, [], Limits(), {})
    job = Job(new_id("job"), tenant.id, JobState.ACCEPTED, spec, time.time(), None)
    store.add_job(job, None, Admission(QUOTAS, time.time()))


def add_history(engine: Engine, tenant: Tenant, jobs: int) -> None:
    """`jobs` finished jobs of `tenant`, each with one artifact (counted in stored_bytes)."""
    now, spec = time.time(), json.dumps({"image": "python", "code": "print(1)"})
    job_rows = [
        {"id": f"job_h{n}", "tenant": tenant.id, "spec": spec, "at": now - n} for n in range(jobs)
    ]
    artifact_rows = [
        {"id": f"art_h{n}", "tenant": tenant.id, "job": f"job_h{n}"} for n in range(jobs)
    ]
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, tenant_id, state, spec, accepted_at, detail,"
                " fencing_token, usage, attempts, pooled) VALUES"
                " (:id, :tenant, 'completed', :spec, :at, '', 0, '{}', '[]', false)"
            ),
            job_rows,
        )
        conn.execute(
            text(
                "INSERT INTO artifacts (id, tenant_id, job_id, path, size, sha256, created_at)"
                f" VALUES (:id, :tenant, :job, 'chart.png', {ARTIFACT_BYTES}, '0', 0)"
            ),
            artifact_rows,
        )
        conn.execute(
            text("UPDATE tenants SET stored_bytes = :bytes WHERE id = :tenant"),
            {"bytes": jobs * ARTIFACT_BYTES, "tenant": tenant.id},
        )


def measure(engine: Engine, history: int, runs: int) -> dict[str, Any]:
    store = SqlStore(engine)
    store.create_schema()
    tenant = Tenant(new_id("ten"), "bench", {}, None, time.time())
    store.add_tenant(tenant)
    fresh = summary(timed(lambda: submit(store, tenant), runs))
    add_history(engine, tenant, history)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:  # as autovacuum would have by then: current statistics
            conn.execute(text("ANALYZE"))
    aged = summary(timed(lambda: submit(store, tenant), runs))
    ratio = round(aged["median_ms"] / fresh["median_ms"], 2)
    return {"fresh_tenant": fresh, f"after_{history}_jobs": aged, "aged_vs_fresh": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    report = {}
    for name, engine_of in (("sqlite", sqlite_engine), ("postgres", postgres_engine)):
        with engine_of() as engine:
            report[name] = measure(engine, args.history, args.runs)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
