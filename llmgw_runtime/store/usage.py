"""Usage in the store: requests, tokens and refusals per API key and model, summed per
hour (``usage``) and since the store began (``usage_totals``), and the last report applied
per router worker (``usage_reporters``), which makes a retried report count once. Plain SQL; the control
service's usage API (control/usage_api.py) decides what to write."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from ..api.fields import MAX_INT
from .schema import accounts, usage, usage_reporters, usage_totals
from .upsert import add_rows

HOUR_S = 3600.0
RETENTION_S = 400 * 86400.0      # hourly rows kept this long (the totals for ever)
REPORTER_TTL_S = 7 * 86400.0     # a reporter silent this long is forgotten (its worker died)
COUNTS = ("requests", "prompt_tokens", "completion_tokens", "refused")
BY = {"key": ("key",), "model": ("model",), "key,model": ("key", "model")}
# Every stored count and every sum read back stops here (JSON's exact integers, the bound
# of the answers' counts): an absurd report saturates a counter instead of overflowing a
# 64-bit column (a report's entries are bounded too, api/usage.py, so a row plus one
# report stays far inside 64 bits).
MAX_COUNT = MAX_INT


class Used(NamedTuple):
    """What one key used of one model."""

    key: str
    model: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    refused: int = 0      # the key's requests the routers refused (api/usage.py)


def bucket_of(when: float) -> float:
    """The start of the hour ``when`` is in (Unix seconds)."""
    return math.floor(when / HOUR_S) * HOUR_S


def claim_report(conn: Connection, reporter: str, seq: int, now: float) -> bool:
    """Mark ``reporter``'s report ``seq`` applied; False when it (or a later one) was
    already: a retry. Safe against the same report arriving twice at once: the second
    waits for the first's row lock (PostgreSQL) or write lock (SQLite) and then sees it."""
    took = conn.execute(usage_reporters.update()
                        .where(usage_reporters.c.reporter == reporter)
                        .where(usage_reporters.c.seq < seq)
                        .values(seq=seq, updated=now)).rowcount
    if took:
        return True
    if conn.execute(sa.select(usage_reporters.c.seq)
                    .where(usage_reporters.c.reporter == reporter)).first() is not None:
        return False
    try:
        with conn.begin_nested():
            conn.execute(usage_reporters.insert().values(reporter=reporter, seq=seq,
                                                         updated=now))
    except IntegrityError:
        return False
    return True


def add_usage(conn: Connection, bucket: float, used: Iterable[Used]) -> None:
    """Add ``used`` to the hour ``bucket`` and to the totals (rows of one key and model
    are summed first)."""
    merged: dict[tuple[str, str], list[int]] = {}
    for u in used:
        counts = merged.setdefault((u.key, u.model), [0, 0, 0, 0])
        counts[0] += u.requests
        counts[1] += u.prompt_tokens
        counts[2] += u.completion_tokens
        counts[3] += u.refused
    if not merged:
        return
    rows = [{"key": key, "model": model,
             **{c: min(n, MAX_COUNT) for c, n in zip(COUNTS, counts, strict=True)}}
            for (key, model), counts in sorted(merged.items())]
    add_rows(conn, usage, ("bucket", "key", "model"), [{"bucket": bucket, **r} for r in rows],
             COUNTS, cap=MAX_COUNT)
    add_rows(conn, usage_totals, ("key", "model"), rows, COUNTS, cap=MAX_COUNT)


def prune(conn: Connection, now: float) -> None:
    """Forget hourly rows older than :data:`RETENTION_S` and reporters silent longer than
    :data:`REPORTER_TTL_S` (both indexed: cheap when there is nothing to forget)."""
    conn.execute(usage.delete().where(usage.c.bucket < bucket_of(now - RETENTION_S)))
    conn.execute(usage_reporters.delete()
                 .where(usage_reporters.c.updated < now - REPORTER_TTL_S))


def key_names(conn: Connection, hashes: Iterable[str]) -> dict[str, str]:
    """API keys' names (without ``key:``) by the SHA-256 of the key, for those that exist."""
    wanted = sorted(set(hashes))
    names: dict[str, str] = {}
    for start in range(0, len(wanted), 500):
        rows = conn.execute(sa.select(accounts.c.token_hash, accounts.c.name)
                            .where(accounts.c.kind == "api_key")
                            .where(accounts.c.token_hash.in_(wanted[start:start + 500])))
        names.update({r.token_hash: r.name.removeprefix("key:") for r in rows})
    return names


def usage_since(conn: Connection, since: float, by: str) -> list[dict[str, Any]]:
    """Usage from the start of the hour ``since`` is in, summed ``by`` "key", "model" or
    "key,model"; sorted by those."""
    columns = [usage.c[name] for name in BY[by]]
    # SQLite's sum() fails past 64 bits; its total() is a float and never does.
    total = sa.func.total if conn.dialect.name == "sqlite" else sa.func.sum
    query = (sa.select(*columns, *(total(usage.c[c]).label(c) for c in COUNTS))
             .where(usage.c.bucket >= bucket_of(since))
             .group_by(*columns).order_by(*columns))
    return [{**{name: getattr(row, name) for name in BY[by]},
             **{c: min(int(getattr(row, c) or 0), MAX_COUNT) for c in COUNTS}}
            for row in conn.execute(query)]


def series(conn: Connection, since: float, by: str,
           only: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Usage per hour from the start of the hour ``since`` is in (the console's charts):
    one row per hour (``bucket``) and ``by`` "key" or "model" (its counts summed over the
    other), or per hour alone with ``by`` "" (everything); with ``only``, just those keys
    or models. Sorted by hour, then name. Hours without usage have no row."""
    columns = [usage.c[name] for name in BY[by]] if by else []
    total = sa.func.total if conn.dialect.name == "sqlite" else sa.func.sum
    query = (sa.select(usage.c.bucket, *columns,
                       *(total(usage.c[c]).label(c) for c in COUNTS))
             .where(usage.c.bucket >= bucket_of(since))
             .group_by(usage.c.bucket, *columns).order_by(usage.c.bucket, *columns))
    if only is not None:
        if len(columns) != 1:
            raise ValueError("series: only needs by 'key' or 'model'")
        query = query.where(columns[0].in_(sorted(set(only))))
    return [{"bucket": float(row.bucket),
             **{name: getattr(row, name) for name in (BY[by] if by else ())},
             **{c: min(int(getattr(row, c) or 0), MAX_COUNT) for c in COUNTS}}
            for row in conn.execute(query)]


def totals(conn: Connection) -> list[Used]:
    """Every key's usage of every model since the store began."""
    rows = conn.execute(sa.select(usage_totals).order_by(usage_totals.c.key,
                                                         usage_totals.c.model))
    return [Used(r.key, r.model, *(min(int(getattr(r, c)), MAX_COUNT) for c in COUNTS))
            for r in rows]
