"""The fleet's change log (issue 30): ``changes``, one row per thing a committed write
changed (a node, a model, a replica, a node's device readings, or ``all``), stamped with
the "fleet" generation that write moved to (``seq``), so a control process re-reads or
forgets only what changed since the generation it last saw (store/changes.py).

``generations`` gets ``changes_floor``: every entry up to it may be gone (pruned, or
written before this revision), so a reader whose last generation is below it re-reads
everything. It starts at the fleet generation as this revision finds it.

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "changes",
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(20), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("at", sa.Float, nullable=False))
    op.create_index("ix_changes_seq", "changes", ["seq"])
    fleet = op.get_bind().execute(sa.text(
        "SELECT value FROM generations WHERE name = 'fleet'")).scalar()
    generations = sa.table("generations", sa.column("name", sa.String),
                           sa.column("value", sa.BigInteger))
    op.bulk_insert(generations, [{"name": "changes_floor", "value": int(fleet or 0)}])


def downgrade() -> None:
    op.execute("DELETE FROM generations WHERE name = 'changes_floor'")
    op.drop_index("ix_changes_seq", "changes")
    op.drop_table("changes")
