"""API keys' limits in the store (``accounts.rpm``, ``accounts.tpm``). The rest of an
account (its token, priority, scope, expiry) is in ``repo``."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from .schema import accounts

UNCHANGED: Any = object()


def set_key_limits(conn: Connection, account_id: int, *, rpm: int | None = UNCHANGED,
                   tpm: int | None = UNCHANGED) -> None:
    """Set the account's requests and tokens per minute (None: no limit); a limit not
    given stays as it is."""
    values = {name: value for name, value in (("rpm", rpm), ("tpm", tpm))
              if value is not UNCHANGED}
    if values:
        conn.execute(accounts.update().where(accounts.c.id == account_id).values(**values))


def key_limits(row: Any) -> tuple[int | None, int | None]:
    """(rpm, tpm) of an account's row; None where it has no limit."""
    return getattr(row, "rpm", None), getattr(row, "tpm", None)
