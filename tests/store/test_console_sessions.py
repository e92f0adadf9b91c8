"""Console sessions in the store, on both backends: only the id's hash is stored, expiry,
logout, pruning, and a session ends when its account is no longer an admin."""

from __future__ import annotations

import sqlalchemy as sa

from llmgw_runtime.security import hash_token
from llmgw_runtime.store import Store, repo, sessions
from llmgw_runtime.store.schema import console_sessions


def admin(store: Store, name: str = "admin", kind: str = "admin") -> None:
    with store.begin() as conn:
        repo.put_account(conn, name, kind, hash_token(f"token-of-{name}"), 1.0)


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
