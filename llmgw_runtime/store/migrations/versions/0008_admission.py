"""Admission and routing (issue 16):

- ``models.routing``, ``slots``, ``max_queue``, ``max_wait_s``: the catalog's settings of
  how routers admit and route a model's requests (defaults: prefix-affinity, unknown slots
  (from the args or the engine's default), 100 waiting, 30 s);
- ``models.capacity_at`` and ``capacity``: when a router last found the model at capacity
  (store clock) and what it reported (JSON), for ``ctl status`` and the console;
- ``accounts.priority``: an API key's priority in a model's queue (high, normal, low).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("routing", sa.String(20), nullable=False,
                                   server_default="prefix-affinity"))
        batch.add_column(sa.Column("slots", sa.Integer, nullable=True))
        batch.add_column(sa.Column("max_queue", sa.Integer, nullable=False,
                                   server_default="100"))
        batch.add_column(sa.Column("max_wait_s", sa.Float, nullable=False,
                                   server_default="30"))
        batch.add_column(sa.Column("capacity_at", sa.Float, nullable=True))
        batch.add_column(sa.Column("capacity", sa.Text, nullable=True))
    with op.batch_alter_table("accounts") as batch:
        batch.add_column(sa.Column("priority", sa.String(10), nullable=False,
                                   server_default="normal"))


def downgrade() -> None:
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("priority")
    with op.batch_alter_table("models") as batch:
        for column in ("capacity", "capacity_at", "max_wait_s", "max_queue", "slots",
                       "routing"):
            batch.drop_column(column)
