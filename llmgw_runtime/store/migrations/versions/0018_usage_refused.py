"""Refusals per API key (issue 29): ``usage.refused`` and ``usage_totals.refused``, the
key's requests the routers refused (api/usage.py, UsageEntry.refused), per hour and since
the store began (the control service's ``llmgw_usage_refused_total``). Rows stored before
count 0.

Revision ID: 0018
Revises: 0017
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

TABLES = ("usage", "usage_totals")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("refused", sa.BigInteger, nullable=False,
                                       server_default="0"))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("refused")
