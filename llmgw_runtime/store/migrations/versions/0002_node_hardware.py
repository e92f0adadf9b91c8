"""Nodes keep what their device source saw beyond devices: cards (MIG modes, cards that can
run nothing and why), problems, the source and the driver version.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("hardware", sa.Text, nullable=False, server_default="{}"))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("hardware")
