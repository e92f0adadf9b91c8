"""Routers heard from (issue 28): whether each router serves requests without an API key,
as its idle posts say, and when the control service last heard so (store clock), so that
creating a key can say when keys bind only the clients that send them.

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "routers",
        sa.Column("id", sa.String(100), primary_key=True),
        sa.Column("keys_optional", sa.Integer, nullable=False),     # 0 or 1
        sa.Column("heard", sa.Float, nullable=False))
    op.create_index("ix_routers_heard", "routers", ["heard"])


def downgrade() -> None:
    op.drop_index("ix_routers_heard", "routers")
    op.drop_table("routers")
