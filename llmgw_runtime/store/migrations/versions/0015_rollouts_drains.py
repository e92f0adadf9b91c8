"""Issue 27: rollouts, drains and graceful stops.

``models``: the catalog's ``rollout`` (JSON) and ``drain_timeout_s``; the rollout's state,
the previous definition and ``deleted_at``. ``replicas``: the definition each runs (hash and
launch fields) and its drain (since, reason, timeout, in flight per router worker).
``nodes``: ``cordoned`` and ``drain``. Replicas that exist run their model's current
definition: their hash is filled in from it, so an upgrade rolls nothing.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("rollout", sa.Text, nullable=True))
        batch.add_column(sa.Column("drain_timeout_s", sa.Float, nullable=False,
                                   server_default="120.0"))
        batch.add_column(sa.Column("rollout_state", sa.Text, nullable=True))
        batch.add_column(sa.Column("previous_definition", sa.Text, nullable=True))
        batch.add_column(sa.Column("deleted_at", sa.Float, nullable=True))
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("definition_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("launch", sa.Text, nullable=True))
        batch.add_column(sa.Column("drain_since", sa.Float, nullable=True))
        batch.add_column(sa.Column("drain_reason", sa.Text, nullable=True))
        batch.add_column(sa.Column("drain_timeout_s", sa.Float, nullable=True))
        batch.add_column(sa.Column("in_flight", sa.Text, nullable=True))
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("cordoned", sa.Integer, nullable=False,
                                   server_default="0"))
        batch.add_column(sa.Column("drain", sa.Text, nullable=True))
    op.execute("UPDATE replicas SET definition_hash = (SELECT models.definition_hash FROM "
               "models WHERE models.name = replicas.model)")


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("drain")
        batch.drop_column("cordoned")
    with op.batch_alter_table("replicas") as batch:
        for name in ("in_flight", "drain_timeout_s", "drain_reason", "drain_since", "launch",
                     "definition_hash"):
            batch.drop_column(name)
    with op.batch_alter_table("models") as batch:
        for name in ("deleted_at", "previous_definition", "rollout_state", "drain_timeout_s",
                     "rollout"):
            batch.drop_column(name)
