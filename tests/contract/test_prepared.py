"""Prepared statements (store/prepared.py) against SQLite and the real PostgreSQL: the values
come back as SQLAlchemy's own execution gives them, and errors come out as its own."""

import time

import pytest
from sqlalchemy import bindparam, create_engine, insert, select, text, update
from sqlalchemy.exc import IntegrityError

from sandcell.domain.errors import StoreUnavailable
from sandcell.store.prepared import Prepared
from sandcell.store.schema import jobs, tenants
from sandcell.store.sql import SqlStore
from tests.contract.test_store import PG_URL, _job, _tenant, store  # noqa: F401  (the fixture)

_INSERT_TENANT = Prepared(insert(tenants), columns_from_values=True)
_TENANT = Prepared(select(tenants).where(tenants.c.id == bindparam("tenant")))


@pytest.fixture
def db(store: SqlStore) -> SqlStore:  # noqa: F811  (test_store's fixture, SQLite and PostgreSQL)
    return store


def test_a_row_written_and_read_is_what_sqlalchemy_reads(db: SqlStore) -> None:
    values = {
        "id": "ten_p",
        "name": "p",
        "limits": {"cpu": 1.5, "nested": [1, None, "x"]},
        "images": None,
        "created_at": 12.25,
        "quotas": {},
    }
    with db.engine.begin() as conn:
        assert _INSERT_TENANT.write(conn, values) == 1
    with db.engine.begin() as conn:
        ours = _TENANT.first(conn, {"tenant": "ten_p"})
        theirs = conn.execute(select(tenants).where(tenants.c.id == "ten_p")).one()._asdict()
        assert _TENANT.first(conn, {"tenant": "nobody"}) is None
    assert ours == theirs
    assert ours is not None and ours["limits"] == values["limits"] and ours["stored_bytes"] == 0


def test_a_value_bound_when_the_statement_was_built_is_used(db: SqlStore) -> None:
    tenant = _tenant(db)
    job = _job(tenant)
    db.add_job(job, None)
    started = Prepared(
        update(jobs)
        .where(jobs.c.id == bindparam("job"))
        .values(state="running", fencing_token=jobs.c.fencing_token + 1)
        .returning(jobs.c.state, jobs.c.fencing_token, jobs.c.pooled)
    )
    with db.engine.begin() as conn:
        [row] = started.rows(conn, {"job": job.id})
    assert row == {"state": "running", "fencing_token": job.fencing_token + 1, "pooled": False}
    assert db.get_job(tenant.id, job.id).state.value == "running"  # type: ignore[union-attr]


def test_a_driver_error_is_sqlalchemys_and_undoes_the_transaction(db: SqlStore) -> None:
    tenant = _tenant(db)
    job = _job(tenant)
    db.add_job(job, None)
    again = Prepared(insert(jobs), columns_from_values=True)
    values = {"id": job.id, "tenant_id": tenant.id, "state": "accepted", "spec": {}}
    with pytest.raises(IntegrityError), db.engine.begin() as conn:
        _INSERT_TENANT.write(conn, {"id": "ten_q", "name": "q", "limits": {}, "created_at": 1.0})
        again.write(conn, values | {"accepted_at": 1.0})
    assert db.get_tenant("ten_q") is None  # the insert before the error is undone too


def test_a_statement_rendered_at_each_execution_is_refused(db: SqlStore) -> None:
    many = Prepared(select(jobs.c.id).where(jobs.c.id.in_(bindparam("ids", expanding=True))))
    with pytest.raises(ValueError, match="each execution"), db.engine.begin() as conn:
        many.rows(conn, {"ids": ["a", "b"]})


def test_a_lost_connection_is_unavailable_once_then_replaced(db: SqlStore) -> None:
    if db.engine.dialect.name != "postgresql":
        pytest.skip("a server that drops its connections: PostgreSQL")
    tenant = _tenant(db)
    job = _job(tenant)
    db.add_job(job, None)
    with db.engine.connect() as conn:  # the pool's only connection so far
        backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    admin = create_engine(PG_URL)
    with admin.begin() as other:
        other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
    admin.dispose()
    time.sleep(0.2)
    with pytest.raises(StoreUnavailable):
        db.get_job(tenant.id, job.id)
    found = db.get_job(tenant.id, job.id)  # a new connection: the dead one was dropped
    assert found is not None and found.id == job.id
