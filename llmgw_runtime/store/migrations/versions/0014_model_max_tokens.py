"""Issue 26: ``models.max_tokens``, a model's cap on the tokens one answer may generate
(JSON ``{default, max, clamp}``; NULL: none).

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("max_tokens", sa.Text, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("max_tokens")
