"""Issue 17: autoscaling. ``models.replicas_max`` (the catalog's max when replicas is a
range; NULL: fixed) and ``models.autoscale`` (its settings, JSON; NULL: not scaled);
``models.load`` (what routers reported of its load, JSON); ``models.scale_target`` and
``models.scale_state`` (the reconciler's replica target and its windows, JSON).

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

COLUMNS = (("replicas_max", sa.Integer), ("autoscale", sa.Text), ("load", sa.Text),
           ("scale_target", sa.Integer), ("scale_state", sa.Text))


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
