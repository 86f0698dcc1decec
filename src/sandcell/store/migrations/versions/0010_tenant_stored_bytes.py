"""tenants.stored_bytes, jobs_ and sessions_by_tenant_state, files_by_sha: no history scans

Quotas read a running total and count only live rows; a blob's last-use check on retirement
finds its file by index.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(
            sa.Column("stored_bytes", sa.BigInteger(), nullable=False, server_default="0")
        )
    op.execute(
        "UPDATE tenants SET stored_bytes ="
        " (SELECT COALESCE(SUM(size), 0) FROM files WHERE files.tenant_id = tenants.id)"
        " + (SELECT COALESCE(SUM(size), 0) FROM artifacts WHERE artifacts.tenant_id = tenants.id)"
    )
    op.create_index("jobs_by_tenant_state", "jobs", ["tenant_id", "state"])
    op.create_index("sessions_by_tenant_state", "sessions", ["tenant_id", "state"])
    op.create_index("files_by_sha", "files", ["sha256"])


def downgrade() -> None:
    op.drop_index("files_by_sha", table_name="files")
    op.drop_index("sessions_by_tenant_state", table_name="sessions")
    op.drop_index("jobs_by_tenant_state", table_name="jobs")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("stored_bytes")
