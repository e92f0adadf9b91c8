"""Accounts in the store: admin, router and console accounts and API keys (their token
hash, priority, scope, expiry and limits)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import sessions
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


def account_by_hash(conn: Connection, token_hash: str) -> Any | None:
    return conn.execute(sa.select(accounts).where(accounts.c.token_hash == token_hash)).first()


def accounts_of_kind(conn: Connection, kind: str) -> list[Any]:
    return list(conn.execute(sa.select(accounts).where(accounts.c.kind == kind)
                             .order_by(accounts.c.name)))


def put_account(conn: Connection, name: str, kind: str, token_hash: str, now: float,
                priority: str = "normal", models: list[str] | None = None,
                expires_at: float | None = None) -> bool:
    """Create the account ``name`` (``priority``: an API key's, in a model's queue) or
    give it a new token; True when an existing account's token changed (rotated)."""
    row = conn.execute(sa.select(accounts).where(accounts.c.name == name)).first()
    if row is None:
        conn.execute(accounts.insert().values(name=name, kind=kind, token_hash=token_hash,
                                              is_admin=int(kind == "admin"), created=now,
                                              priority=priority,
                                              models=None if models is None else
                                              json.dumps(sorted(set(models))),
                                              expires_at=expires_at))
    elif row.token_hash != token_hash or row.kind != kind:
        conn.execute(accounts.update().where(accounts.c.name == name)
                     .values(token_hash=token_hash, kind=kind, is_admin=int(kind == "admin")))
        # A rotated token ends the console sessions bought with the old one.
        sessions.end_all(conn, name)
        return True
    return False


def update_key(conn: Connection, name: str, kind: str, *, priority: str | None = None,
               models: list[str] | None = UNCHANGED,
               expires_at: float | None = UNCHANGED) -> Any | None:
    """Change what is given of the account ``name`` of ``kind``: its priority, the models
    it may use (None: all) and when it expires (None: never); its row as it was, or None
    when there is none."""
    row = conn.execute(sa.select(accounts).where(accounts.c.name == name)
                       .where(accounts.c.kind == kind)).first()
    if row is None:
        return None
    values: dict[str, Any] = {}
    if priority is not None:
        values["priority"] = priority
    if models is not UNCHANGED:
        values["models"] = None if models is None else json.dumps(sorted(set(models)))
    if expires_at is not UNCHANGED:
        values["expires_at"] = expires_at
    if values:
        conn.execute(accounts.update().where(accounts.c.id == row.id).values(**values))
    return row


def key_models(row: Any) -> list[str] | None:
    """The models an API key's row may use; None: every model."""
    raw = getattr(row, "models", None)
    return None if raw is None else list(json.loads(raw))


def account_exists(conn: Connection, name: str) -> bool:
    return conn.execute(sa.select(accounts.c.id).where(accounts.c.name == name)).first() \
        is not None


def delete_account(conn: Connection, name: str, kind: str) -> bool:
    """Delete the account ``name`` of ``kind`` (an API key: ``key:<name>``) and its console
    sessions; whether there was one. Routers drop a deleted key on their next routes
    refresh (the routes table carries the keys' hashes)."""
    deleted = conn.execute(accounts.delete().where(accounts.c.name == name)
                           .where(accounts.c.kind == kind)).rowcount > 0
    if deleted:
        sessions.end_all(conn, name)
    return deleted
