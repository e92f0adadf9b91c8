"""Web console sessions in the store, so they hold across gunicorn workers and control
instances. The browser holds a random session id; the store keeps only its SHA-256
(``security.hash_token``), never the id itself."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..security import hash_token
from .schema import accounts, console_sessions


@dataclass(frozen=True)
class Session:
    account: str
    csrf: str
    created: float
    expires: float


def create(conn: Connection, account: str, now: float, lifetime_s: float) -> tuple[str, Session]:
    """A new session for ``account``: returns the raw id for the cookie (shown once, not
    stored) and the session with its fresh CSRF token."""
    raw = secrets.token_urlsafe(32)
    session = Session(account=account, csrf=secrets.token_urlsafe(32), created=now,
                      expires=now + lifetime_s)
    conn.execute(console_sessions.insert().values(
        id_hash=hash_token(raw), account=account, csrf=session.csrf, created=now,
        expires=session.expires))
    return raw, session


def get(conn: Connection, raw: str, now: float) -> Session | None:
    """The unexpired session with this raw id whose account is still an admin; None
    otherwise (unknown, expired, logged out, or the account is gone or demoted)."""
    if not raw:
        return None
    row = conn.execute(
        sa.select(console_sessions)
        .join(accounts, accounts.c.name == console_sessions.c.account)
        .where(console_sessions.c.id_hash == hash_token(raw))
        .where(console_sessions.c.expires > now)
        .where(accounts.c.kind == "admin")).first()
    if row is None:
        return None
    return Session(account=row.account, csrf=row.csrf, created=row.created,
                   expires=row.expires)


def delete(conn: Connection, raw: str) -> bool:
    """End the session with this raw id (logout); whether there was one."""
    result = conn.execute(console_sessions.delete()
                          .where(console_sessions.c.id_hash == hash_token(raw)))
    return bool(result.rowcount)


def prune(conn: Connection, now: float) -> int:
    """Delete every expired session; how many."""
    result = conn.execute(console_sessions.delete().where(console_sessions.c.expires <= now))
    return int(result.rowcount)


def create_for_token(conn: Connection, token_hash: str, now: float,
                     lifetime_s: float) -> tuple[str, Session] | None:
    """A new session for the admin account whose token hashes to ``token_hash``, or None
    if there is none (any more). The account row stays locked to the end of the
    transaction (PostgreSQL), so a token rotated meanwhile either refuses this login or
    ends the session it made (``end_all``): no session outlives the token it came from."""
    row = conn.execute(sa.select(accounts.c.name)
                       .where(accounts.c.token_hash == token_hash)
                       .where(accounts.c.kind == "admin").with_for_update()).first()
    if row is None:
        return None
    return create(conn, row.name, now, lifetime_s)


def end_all(conn: Connection, account: str) -> int:
    """End every session of ``account`` (its token changed); how many."""
    result = conn.execute(console_sessions.delete()
                          .where(console_sessions.c.account == account))
    return int(result.rowcount)
