"""Why a node's report could not be used in full (an address it cannot show it owns, data
the planner cannot use): shown in ``ctl nodes`` and the console, NULL when all is well.

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
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("problem", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("problem")
