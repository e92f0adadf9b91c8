"""API keys as a product, part two (issue 17): limits and usage.

- ``accounts.rpm``, ``accounts.tpm``: an API key's requests and tokens per minute (NULL:
  no limit);
- ``usage``: tokens per key and model, summed per hour of the store's clock;
- ``usage_totals``: the same since the store began (the /metrics counters);
- ``usage_reporters``: the last usage report applied per router worker, so that a retried
  report is not counted twice.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _counts() -> list[sa.Column]:       # type: ignore[type-arg]
    return [sa.Column("requests", sa.BigInteger, nullable=False),
            sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
            sa.Column("completion_tokens", sa.BigInteger, nullable=False)]


def upgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.add_column(sa.Column("rpm", sa.Integer, nullable=True))
        batch.add_column(sa.Column("tpm", sa.BigInteger, nullable=True))
    op.create_table(
        "usage",
        sa.Column("bucket", sa.Float, primary_key=True),
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("model", sa.String(200), primary_key=True),
        *_counts())
    op.create_table(
        "usage_totals",
        sa.Column("key", sa.String(200), primary_key=True),
        sa.Column("model", sa.String(200), primary_key=True),
        *_counts())
    op.create_table(
        "usage_reporters",
        sa.Column("reporter", sa.String(100), primary_key=True),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("updated", sa.Float, nullable=False))
    op.create_index("ix_usage_reporters_updated", "usage_reporters", ["updated"])


def downgrade() -> None:
    op.drop_index("ix_usage_reporters_updated", "usage_reporters")
    op.drop_table("usage_reporters")
    op.drop_table("usage_totals")
    op.drop_table("usage")
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("tpm")
        batch.drop_column("rpm")
