"""API keys as a product, part one (issue 17): scope and expiry.

- ``accounts.models``: the models an API key may use, a JSON list of names (NULL: every
  model, as before);
- ``accounts.expires_at``: when the key stops working (store clock, seconds since the
  epoch; NULL: never).

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.add_column(sa.Column("models", sa.Text, nullable=True))
        batch.add_column(sa.Column("expires_at", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("expires_at")
        batch.drop_column("models")
