"""The report path's cost at 2,000 agents (issue 14):

- ``nodes.inventory``: a digest of the slow-changing part of a node's report (engines,
  weights, hardware); a report that repeats it writes only what changed;
- ``nodes.plan_problem``: why the planner leaves a node out, apart from ``problem`` (what
  its reports set), so the two no longer overwrite each other every pass;
- ``generations``: the "fleet" counter, moved by every transaction that changes what a
  node should run or what is stored of a node beyond its last report, so the control
  service answers a steady node's report from its caches while it stands still.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("inventory", sa.String(64), nullable=True))
        batch.add_column(sa.Column("plan_problem", sa.Text, nullable=True))
    table = op.create_table(
        "generations",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )
    op.bulk_insert(table, [{"name": "fleet", "value": 0}])


def downgrade() -> None:
    op.drop_table("generations")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("plan_problem")
        batch.drop_column("inventory")
