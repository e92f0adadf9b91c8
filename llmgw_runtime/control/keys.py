"""Router API keys: what creating, changing and deleting one writes, and the events that
say so (the admin views in keys_api.py only parse, call and answer). Each function runs
in the caller's transaction; times are the store's clock.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from ..api.admin import Deleted, KeyCreate, KeyCreated, KeyInfo, Keys, KeyUpdate
from ..api.router import KEYS_OPTIONAL_POST_S
from ..errors import ConflictError, NotFoundError
from ..security import hash_token
from ..status.tables import largest_unit
from ..store import accounts, repo, routers

# Routers heard from this recently count for a created key's note: they post at least
# every KEYS_OPTIONAL_POST_S while they serve without keys, so a minute spans two posts.
HEARD_WITHIN_S = 2 * KEYS_OPTIONAL_POST_S


def key_info(row: Any, now: float) -> KeyInfo:
    """A key as ``GET /api/v1/keys`` lists it."""
    expires_at = row.expires_at
    rpm, tpm = accounts.key_limits(row)
    return KeyInfo(name=row.name.removeprefix("key:"), created=row.created,
                   priority=row.priority, models=accounts.key_models(row),
                   expires_at=expires_at,
                   expired=expires_at is not None and expires_at <= now, rpm=rpm, tpm=tpm)


def describe(models: list[str] | None, expires_at: float | None, now: float,
             rpm: int | None = None, tpm: int | None = None) -> str:
    """What a key may do, for its event: "for models a, b, expiring in 30 d, at most 60
    requests and 10000 tokens per minute"."""
    parts = []
    if models is not None:
        parts.append("for model" + ("" if len(models) == 1 else "s") + " " + ", ".join(models))
    if expires_at is not None:
        parts.append(f"expiring in {largest_unit(expires_at - now)}")
    limits = [f"{n} {what}" for n, what in ((rpm, "requests"), (tpm, "tokens")) if n]
    if limits:
        parts.append("at most " + " and ".join(limits) + " per minute")
    return ", ".join(parts)


def create(conn: Connection, spec: KeyCreate, key: str, now: float) -> KeyCreated:
    """Store the new key ``key`` (only its hash is kept) as ``spec`` says."""
    name = spec.name
    account = f"key:{name}"
    if accounts.account_exists(conn, account):
        raise ConflictError(f"an API key named {name!r} exists; pick another name")
    expires_at = None if spec.expires_in_s is None else now + spec.expires_in_s
    models = None if spec.models is None else sorted(set(spec.models))
    accounts.put_account(conn, account, "api_key", hash_token(key), now,
                         priority=spec.priority, models=models, expires_at=expires_at)
    if spec.rpm is not None or spec.tpm is not None:
        made = accounts.account_by_hash(conn, hash_token(key))
        assert made is not None        # just made, in this transaction
        accounts.set_key_limits(conn, made.id, rpm=spec.rpm, tpm=spec.tpm)
    what = describe(models, expires_at, now, spec.rpm, spec.tpm)
    repo.add_event(conn, now, "key", name, "API key created"
                   + ("" if spec.priority == "normal" else f" with {spec.priority} priority")
                   + (f" {what}" if what else ""))
    return KeyCreated(name=name, key=key, priority=spec.priority, models=models,
                      expires_at=expires_at, rpm=spec.rpm, tpm=spec.tpm,
                      note=keys_optional_note(routers.keys_optional_since(
                          conn, now - HEARD_WITHIN_S)))


def keys_optional_note(router_ids: list[str]) -> str | None:
    """What creating a key says when routers heard from lately serve requests without any
    key (``router_ids``), or None when none does."""
    if not router_ids:
        return None
    n = len(router_ids)
    return (f"{n} router{'s' if n > 1 else ''} heard from in the last minute "
            f"serve{'s' if n == 1 else ''} requests without any key (started with "
            "--no-require-api-key, as `llmgw up` does): this key's scope and limits bind "
            "only clients that send it; require keys with `llmgw up --require-api-key` or "
            "LLMGW_REQUIRE_API_KEY=1")


def listing(conn: Connection, now: float) -> Keys:
    return Keys(keys=[key_info(r, now) for r in accounts.accounts_of_kind(conn, "api_key")])


def update(conn: Connection, name: str, change: KeyUpdate, now: float, who: str) -> KeyInfo:
    """Change key ``name`` as ``change`` says; one event per thing that changed."""
    fields: dict[str, Any] = {}
    if change.models is not None:
        fields["models"] = None if change.models == "all" else sorted(set(change.models))
    limits = {kind: None if value == "none" else value
              for kind, value in (("rpm", change.rpm), ("tpm", change.tpm))
              if value is not None}
    if change.expires_in_s is not None:
        fields["expires_at"] = (None if change.expires_in_s == "never"
                                else now + change.expires_in_s)
    row = accounts.update_key(conn, f"key:{name}", "api_key", priority=change.priority,
                              **fields)
    if row is None:
        raise NotFoundError(f"there is no API key named {name!r}; see `llmgw ctl keys "
                            "list`")
    accounts.set_key_limits(conn, row.id, **limits)
    for line in _changes(row, change.priority, {**fields, **limits}, now):
        repo.add_event(conn, now, "key", name, f"{line} by {who}")
    updated = accounts.account_by_hash(conn, row.token_hash)
    return key_info(updated, now)


def delete(conn: Connection, name: str, now: float, who: str) -> Deleted:
    if not accounts.delete_account(conn, f"key:{name}", "api_key"):
        raise NotFoundError(f"there is no API key named {name!r}; see `llmgw ctl keys "
                            "list`")
    repo.add_event(conn, now, "key", name, f"API key deleted by {who}")
    return Deleted(deleted=name)


_LIMIT_WORDS = {"rpm": "requests per minute", "tpm": "tokens per minute"}


def _changes(row: Any, priority: str | None, fields: dict[str, Any], now: float
             ) -> list[str]:
    """One event line per thing that changed."""
    lines = []
    for kind, was in zip(("rpm", "tpm"), accounts.key_limits(row), strict=True):
        if kind in fields and fields[kind] != was:
            lines.append(f"API key limit {_LIMIT_WORDS[kind]} "
                         f"{'none' if was is None else was} -> "
                         f"{'none' if fields[kind] is None else fields[kind]}")
    if priority is not None and priority != row.priority:
        lines.append(f"API key priority {row.priority} -> {priority}")
    if "models" in fields and fields["models"] != accounts.key_models(row):
        models = fields["models"]
        lines.append("API key limited to " + ", ".join(models) if models is not None
                     else "API key may use every model")
    if "expires_at" in fields and fields["expires_at"] != row.expires_at:
        expires_at = fields["expires_at"]
        lines.append("API key never expires" if expires_at is None
                     else f"API key expires in {largest_unit(expires_at - now)}")
    return lines
