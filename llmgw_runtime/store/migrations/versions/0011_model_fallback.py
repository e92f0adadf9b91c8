"""Issue 17: ``models.fallback``, the models a model's requests go to, in order, when it
is parked, unplaceable or at capacity (a JSON list of names; NULL: none).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("fallback", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("fallback")
