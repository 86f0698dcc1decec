"""worker stop requests: an operator asks a worker to drain or stop through the store

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("stop_mode", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("stop_requested_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("stop_requested_at")
        batch.drop_column("stop_mode")
