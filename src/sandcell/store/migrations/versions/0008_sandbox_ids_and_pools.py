"""sandbox ids and pools: which sandbox ran a job or session, workers' pool figures

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("sandbox_id", sa.String(length=128), nullable=True))
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("pools", sa.JSON(), nullable=True))
    with op.batch_alter_table("sessions") as batch:
        # Sessions recorded before session pools existed all started cold.
        batch.add_column(
            sa.Column("pooled", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("sandbox_id", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("sandbox_id")
        batch.drop_column("pooled")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("pools")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("sandbox_id")
