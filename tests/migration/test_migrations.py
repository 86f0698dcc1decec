"""Migrations produce exactly the schema the code declares, on SQLite and PostgreSQL."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from sandcell.store.migrate import MIGRATIONS
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
