"""Revision 0009 on both backends: a key made before it keeps working with every model
and no expiry; a scope and an expiry round-trip; it downgrades."""

from __future__ import annotations

import sqlalchemy as sa

from llmgw_runtime.store import Store, repo

from .test_admission_store import alembic


def test_a_store_at_0008_keeps_its_keys_unscoped_and_unexpiring(store_url: str) -> None:
    store = Store(store_url)
    try:
        alembic(store, "upgrade", "0008")
        with store.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO accounts (name, kind, token_hash, is_admin, created, priority) "
                "VALUES ('key:app', 'api_key', 'x', 0, 1, 'high')"))
        assert store.migrate() == "0009"
        with store.begin() as conn:
            [key] = repo.accounts_of_kind(conn, "api_key")
            assert (repo.key_models(key), key.expires_at, key.priority) == (None, None, "high")
            repo.update_key(conn, "key:app", "api_key", models=["b", "a"], expires_at=99.5)
            [key] = repo.accounts_of_kind(conn, "api_key")
            assert (repo.key_models(key), key.expires_at) == (["a", "b"], 99.5)
        alembic(store, "downgrade", "0008")
        with store.engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("accounts")}
        assert "models" not in columns and "expires_at" not in columns and "priority" in columns
    finally:
        store.dispose()
