"""Console sessions in the store, on both backends: only the id's hash is stored, expiry,
logout, pruning, and a session ends when its account is no longer an admin, is deleted,
or gets a new token."""

from __future__ import annotations

import sqlalchemy as sa

from llmgw_runtime.security import hash_token
from llmgw_runtime.store import Store, accounts, sessions
from llmgw_runtime.store.schema import console_sessions


def admin(store: Store, name: str = "admin", kind: str = "admin") -> None:
    with store.begin() as conn:
        accounts.put_account(conn, name, kind, hash_token(f"token-of-{name}"), 1.0)


def test_a_session_is_found_by_its_raw_id_and_only_its_hash_is_stored(store: Store) -> None:
    admin(store)
    with store.begin() as conn:
        raw, made = sessions.create(conn, "admin", 100.0, 3600)
    with store.begin() as conn:
        rows = list(conn.execute(sa.select(console_sessions)))
        found = sessions.get(conn, raw, 200.0)
    assert len(rows) == 1 and rows[0].id_hash == hash_token(raw)
    assert raw not in {str(v) for v in rows[0]}
    assert found == made and found.account == "admin" and found.expires == 3700.0
    assert len(made.csrf) >= 40 and made.csrf != raw


def test_an_unknown_or_expired_session_is_not_found(store: Store) -> None:
    admin(store)
    with store.begin() as conn:
        raw, _ = sessions.create(conn, "admin", 100.0, 60)
        assert sessions.get(conn, "not-a-session", 110.0) is None
        assert sessions.get(conn, "", 110.0) is None
        assert sessions.get(conn, raw, 159.0) is not None
        assert sessions.get(conn, raw, 160.0) is None


def test_logout_deletes_the_session(store: Store) -> None:
    admin(store)
    with store.begin() as conn:
        raw, _ = sessions.create(conn, "admin", 100.0, 60)
        other, _ = sessions.create(conn, "admin", 100.0, 60)
    with store.begin() as conn:
        assert sessions.delete(conn, raw)
        assert not sessions.delete(conn, raw)
        assert sessions.get(conn, raw, 110.0) is None
        assert sessions.get(conn, other, 110.0) is not None


def test_prune_deletes_only_expired_sessions(store: Store) -> None:
    admin(store)
    with store.begin() as conn:
        old, _ = sessions.create(conn, "admin", 0.0, 10)
        new, _ = sessions.create(conn, "admin", 0.0, 1000)
    with store.begin() as conn:
        assert sessions.prune(conn, 500.0) == 1
        assert sessions.get(conn, new, 500.0) is not None
        assert conn.execute(sa.select(sa.func.count()).select_from(console_sessions)
                            ).scalar_one() == 1


def test_a_session_ends_when_its_account_is_not_an_admin(store: Store) -> None:
    admin(store, "ops")
    with store.begin() as conn:
        raw, _ = sessions.create(conn, "ops", 0.0, 1000)
        gone, _ = sessions.create(conn, "nobody", 0.0, 1000)
        assert sessions.get(conn, raw, 1.0) is not None
        assert sessions.get(conn, gone, 1.0) is None
    admin(store, "ops", kind="router")
    with store.begin() as conn:
        assert sessions.get(conn, raw, 1.0) is None


def test_a_new_token_for_an_account_ends_its_sessions_and_only_its(store: Store) -> None:
    admin(store, "admin")
    admin(store, "ops")
    with store.begin() as conn:
        mine, _ = sessions.create(conn, "admin", 0.0, 1000)
        theirs, _ = sessions.create(conn, "ops", 0.0, 1000)
    admin(store, "admin")                           # the same token again: nothing ends
    with store.begin() as conn:
        assert sessions.get(conn, mine, 1.0) is not None
        accounts.put_account(conn, "admin", "admin", hash_token("rotated"), 2.0)
    with store.begin() as conn:
        assert sessions.get(conn, mine, 3.0) is None
        assert sessions.get(conn, theirs, 3.0) is not None


def test_a_session_is_made_only_for_a_current_admin_token(store: Store) -> None:
    admin(store, "admin")
    admin(store, "router", kind="router")
    with store.begin() as conn:
        made = sessions.create_for_token(conn, hash_token("token-of-admin"), 0.0, 100)
        assert sessions.create_for_token(conn, hash_token("token-of-router"), 0.0, 100) \
            is None
        assert sessions.create_for_token(conn, hash_token("old"), 0.0, 100) is None
    assert made is not None
    raw, session = made
    with store.begin() as conn:
        assert sessions.get(conn, raw, 1.0) == session and session.account == "admin"


def test_deleting_an_account_ends_its_sessions(store: Store) -> None:
    admin(store, "key:ci", kind="api_key")
    admin(store, "admin")
    with store.begin() as conn:
        raw, _ = sessions.create(conn, "admin", 0.0, 1000)
        assert not accounts.delete_account(conn, "admin", "api_key")   # wrong kind: kept
        assert sessions.get(conn, raw, 1.0) is not None
        assert accounts.delete_account(conn, "key:ci", "api_key")
        assert not accounts.delete_account(conn, "key:ci", "api_key")
        assert accounts.delete_account(conn, "admin", "admin")
        assert sessions.get(conn, raw, 1.0) is None
        assert accounts.accounts_of_kind(conn, "api_key") == []
