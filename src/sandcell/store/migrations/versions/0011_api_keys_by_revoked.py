"""api_keys_by_revoked: the keys revoked lately, found by index

Every worker serving direct cells asks for them, at most once a second (store.sql
revoked_key_ids); without the index that read scans every key ever made.

Revision ID: 0011
Revises: 0010
"""

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("api_keys_by_revoked", "api_keys", ["revoked_at"])


def downgrade() -> None:
    op.drop_index("api_keys_by_revoked", table_name="api_keys")
