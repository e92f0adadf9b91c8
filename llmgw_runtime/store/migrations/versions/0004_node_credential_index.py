"""Every agent report is authenticated by its node credential's hash: index it, so a
report is one index lookup instead of a scan of the nodes table.

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_nodes_credential_hash", "nodes", ["credential_hash"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_nodes_credential_hash", "nodes")
