"""The fleet's history and its device-time (issue 29).

``history_models`` and ``history_classes``: what the reconciler saw each minute (``step``
60, kept two days) and the hours they roll up into (``step`` 3600, kept ``history_days``),
per model and per device class, for the console's charts without a Prometheus.
``device_time``: the device-seconds each model's replicas held per hour and device class,
for GPU-hours per model and per key (docs/operations.md, "GPU-hours").

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "history_models",
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("t", sa.Float, primary_key=True),
        sa.Column("ready", sa.Integer, nullable=False, server_default="0"),
        sa.Column("wanted", sa.Integer, nullable=False, server_default="0"),
        sa.Column("waiting", sa.Integer, nullable=False, server_default="0"),
        sa.Column("busy", sa.Integer, nullable=False, server_default="0"),
        sa.Column("slots", sa.Integer, nullable=False, server_default="0"),
        sa.Column("refused", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("requests", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("first_byte", sa.Text, nullable=True))
    op.create_index("ix_history_models_t", "history_models", ["step", "t"])
    op.create_table(
        "history_classes",
        sa.Column("device_class", sa.String(100), primary_key=True),
        sa.Column("step", sa.Integer, primary_key=True),
        sa.Column("t", sa.Float, primary_key=True),
        sa.Column("devices", sa.Integer, nullable=False, server_default="0"),
        sa.Column("used", sa.Integer, nullable=False, server_default="0"),
        sa.Column("replicas", sa.Integer, nullable=False, server_default="0"))
    op.create_index("ix_history_classes_t", "history_classes", ["step", "t"])
    op.create_table(
        "device_time",
        sa.Column("bucket", sa.Float, primary_key=True),
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("device_class", sa.String(100), primary_key=True),
        sa.Column("seconds", sa.Float, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_table("device_time")
    op.drop_index("ix_history_classes_t", "history_classes")
    op.drop_table("history_classes")
    op.drop_index("ix_history_models_t", "history_models")
    op.drop_table("history_models")
