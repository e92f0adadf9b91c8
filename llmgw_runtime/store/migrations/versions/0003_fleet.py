"""The fleet planner: a model's strategy and download checks; multi-node replicas (a part per
worker node, one rendezvous port per replica); download progress per replica.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("strategy", sa.String(20), nullable=False,
                                   server_default="binpack"))
        batch.add_column(sa.Column("sha256", sa.String(64), nullable=True))
        batch.add_column(sa.Column("size_bytes", sa.BigInteger, nullable=True))
    with op.batch_alter_table("replicas") as batch:
        batch.add_column(sa.Column("rendezvous_port", sa.Integer, nullable=True))
        batch.add_column(sa.Column("progress", sa.Text, nullable=True))
    op.create_table(
        "replica_parts",
        sa.Column("replica_id", sa.String(64),
                  sa.ForeignKey("replicas.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("rank", sa.Integer, primary_key=True),
        sa.Column("node", sa.String(200), nullable=False),
        sa.Column("devices", sa.Text, nullable=False, server_default="[]"),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("updated", sa.Float, nullable=False),
    )
    op.create_index("ix_replica_parts_node", "replica_parts", ["node"])


def downgrade() -> None:
    op.drop_index("ix_replica_parts_node", "replica_parts")
    op.drop_table("replica_parts")
    with op.batch_alter_table("replicas") as batch:
        batch.drop_column("progress")
        batch.drop_column("rendezvous_port")
    with op.batch_alter_table("models") as batch:
        batch.drop_column("size_bytes")
        batch.drop_column("sha256")
        batch.drop_column("strategy")
