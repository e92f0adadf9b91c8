"""The first schema: models, nodes, replicas, events, accounts, leases.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("engine", sa.String(40), nullable=False),
        sa.Column("profile", sa.Text, nullable=False),
        sa.Column("replicas", sa.Integer, nullable=False),
        sa.Column("on_demand", sa.Integer, nullable=False),
        sa.Column("idle_stop_after_s", sa.Float, nullable=True),
        sa.Column("args", sa.Text, nullable=False),
        sa.Column("definition_hash", sa.String(64), nullable=False),
        sa.Column("parked", sa.Integer, nullable=False),
        sa.Column("consecutive_failures", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("last_failure_at", sa.Float, nullable=True),
        sa.Column("activated_at", sa.Float, nullable=True),
        sa.Column("placement_reason", sa.Text, nullable=True),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
    )
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("fabric", sa.String(200), nullable=True),
        sa.Column("address", sa.String(255), nullable=True),
        sa.Column("last_report", sa.Float, nullable=True),
        sa.Column("agent_version", sa.String(40), nullable=True),
        sa.Column("devices", sa.Text, nullable=False),
        sa.Column("engines", sa.Text, nullable=False),
        sa.Column("weights", sa.Text, nullable=False),
        sa.Column("credential_hash", sa.String(64), nullable=True),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(200),
                  sa.ForeignKey("models.name", ondelete="CASCADE"), nullable=False),
        sa.Column("node", sa.String(200), nullable=False),
        sa.Column("devices", sa.Text, nullable=False),
        sa.Column("port", sa.Integer, nullable=True),
        sa.Column("pid", sa.Integer, nullable=True),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("desired", sa.Integer, nullable=False),
        sa.Column("started", sa.Float, nullable=False),
        sa.Column("updated", sa.Float, nullable=False),
        sa.Column("last_used", sa.Float, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
    )
    op.create_index("ix_replicas_model", "replicas", ["model"])
    op.create_index("ix_replicas_node", "replicas", ["node"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("kind", sa.String(40), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
    )
    op.create_index("ix_events_time", "events", ["time"])
    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("is_admin", sa.Integer, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
    )
    op.create_table(
        "leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("expires", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in ("leases", "accounts", "events", "replicas", "nodes", "models"):
        op.drop_table(table)
