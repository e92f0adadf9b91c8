"""Issue 17: ``models.aliases``, other names clients may use for a model (a JSON list of
names; NULL: none). An alias names one model only (the catalog checks it).

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
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("aliases", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("aliases")
