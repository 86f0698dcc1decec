"""Migrations produce exactly the schema the code declares, on SQLite and PostgreSQL."""

from pathlib import Path

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from sandcell.store.migrate import MIGRATIONS, alembic_config
from sandcell.store.schema import metadata
from sandcell.store.sql import SqlStore
from tests.contract.test_store import store  # noqa: F401  (the two-backend fixture)


def test_migrations_equal_the_declared_schema(store: SqlStore) -> None:  # noqa: F811
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []


def test_migrating_twice_is_a_no_op(store: SqlStore) -> None:  # noqa: F811
    store.create_schema()
    with store.engine.connect() as conn:
        version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    assert version == ScriptDirectory(str(MIGRATIONS)).get_current_head()


def test_stored_bytes_start_from_what_a_tenant_already_stores(tmp_path: Path) -> None:
    """0010 adds the running total admission reads: an existing deployment's tenants start
    with the sizes of the files and artifacts they already have."""
    engine = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), "0009")
        rows = [("ten_a", "a"), ("ten_b", "b"), ("ten_c", "c")]
        for tenant_id, name in rows:
            conn.execute(
                text("INSERT INTO tenants (id, name, limits, created_at) VALUES (:i, :n, '{}', 0)"),
                {"i": tenant_id, "n": name},
            )
        conn.execute(
            text(
                "INSERT INTO files (id, tenant_id, name, size, sha256, created_at) VALUES"
                " ('f1', 'ten_a', 'x', 100, '0', 0), ('f2', 'ten_a', 'y', 20, '0', 0),"
                " ('f3', 'ten_b', 'z', 7, '0', 0)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO jobs (id, tenant_id, state, spec, accepted_at, detail,"
                " fencing_token, usage, attempts, pooled)"
                " VALUES ('j1', 'ten_a', 'completed', '{}', 0, '', 0, '{}', '[]', 0)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO artifacts (id, tenant_id, job_id, path, size, sha256, created_at)"
                " VALUES ('a1', 'ten_a', 'j1', 'out.png', 3, '0', 0)"
            )
        )
        command.upgrade(alembic_config(conn), "head")
        stored = dict(conn.execute(text("SELECT id, stored_bytes FROM tenants")).all())
    assert stored == {"ten_a": 123, "ten_b": 7, "ten_c": 0}
