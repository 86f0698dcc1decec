"""sessions

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("last_used_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.Column("idle_timeout_s", sa.Float(), nullable=False),
        sa.Column("paused_at", sa.Float(), nullable=True),
        sa.Column("memory_kept", sa.Boolean(), nullable=True),
        sa.Column("stopped_at", sa.Float(), nullable=True),
        sa.Column("reason", sa.String(length=32), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("executions", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.create_index("sessions_by_state", ["state"], unique=False)
        batch_op.create_index("sessions_by_tenant", ["tenant_id", "created_at"], unique=False)

    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.add_column(sa.Column("url", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_column("url")

    with op.batch_alter_table("sessions", schema=None) as batch_op:
        batch_op.drop_index("sessions_by_tenant")
        batch_op.drop_index("sessions_by_state")

    op.drop_table("sessions")
