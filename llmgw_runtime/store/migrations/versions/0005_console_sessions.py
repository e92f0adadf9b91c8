"""Web console sessions: one row per login, keyed by the SHA-256 of the session id the
browser holds, so every gunicorn worker and control instance sees the same sessions.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_sessions",
        sa.Column("id_hash", sa.String(64), primary_key=True),
        sa.Column("account", sa.String(200), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("expires", sa.Float, nullable=False),
    )
    op.create_index("ix_console_sessions_expires", "console_sessions", ["expires"])


def downgrade() -> None:
    op.drop_index("ix_console_sessions_expires", "console_sessions")
    op.drop_table("console_sessions")
