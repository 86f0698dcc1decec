"""Schema migrations (Alembic), applied at start-up by every process that opens the store."""

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection: object) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def migrate(engine: Engine) -> None:
    """Bring the database to the newest schema; safe to run from several processes."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            # One migrator at a time across API replicas and workers.
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7426561)")
        command.upgrade(alembic_config(connection), "head")
