"""Revisions 0009 and 0010 on both backends: a key made before them keeps working with
every model and no expiry; a scope, an expiry and a model's aliases round-trip; both
downgrade."""

from __future__ import annotations

import sqlalchemy as sa

from llmgw_runtime.store import Store, accounts, repo
from llmgw_runtime.store.models import row_to_spec

from .test_admission_store import alembic, head


def test_a_store_at_0008_keeps_its_keys_unscoped_and_unexpiring(store_url: str) -> None:
    store = Store(store_url)
    try:
        alembic(store, "upgrade", "0008")
        with store.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO accounts (name, kind, token_hash, is_admin, created, priority) "
                "VALUES ('key:app', 'api_key', 'x', 0, 1, 'high')"))
        assert store.migrate() == head()
        with store.begin() as conn:
            [key] = accounts.accounts_of_kind(conn, "api_key")
            assert (accounts.key_models(key), key.expires_at, key.priority) == (None, None, "high")
            accounts.update_key(conn, "key:app", "api_key", models=["b", "a"], expires_at=99.5)
            [key] = accounts.accounts_of_kind(conn, "api_key")
            assert (accounts.key_models(key), key.expires_at) == (["a", "b"], 99.5)
        alembic(store, "downgrade", "0008")
        with store.engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("accounts")}
            model_columns = {c["name"] for c in sa.inspect(conn).get_columns("models")}
        assert "models" not in columns and "expires_at" not in columns and "priority" in columns
        assert "aliases" not in model_columns and "routing" in model_columns
    finally:
        store.dispose()


def test_a_models_aliases_and_fallbacks_round_trip_and_downgrade(store_url: str) -> None:
    from llmgw_runtime.catalog import parse as catalog

    store = Store(store_url)
    try:
        assert store.migrate() == head()
        with store.begin() as conn:
            repo.apply_catalog(conn, catalog.parse(
                "models:\n  - {name: chat, source: /c.gguf, engine: llama.cpp, "
                "profile: {class: cpu}, aliases: [gpt-4o-mini], fallback: [chat2]}\n"
                "  - {name: chat2, source: /c.gguf, engine: llama.cpp, profile: {class: cpu}}\n"),
                1.0)
            row = repo.get_model(conn, "chat")
            assert row_to_spec(row).aliases == ("gpt-4o-mini",)
            assert repo.model_to_dict(row)["aliases"] == ["gpt-4o-mini"]
            assert row_to_spec(row).fallback == ("chat2",)
        alembic(store, "downgrade", "0009")
        with store.engine.connect() as conn:
            model_columns = {c["name"] for c in sa.inspect(conn).get_columns("models")}
        assert "aliases" not in model_columns and "fallback" not in model_columns
    finally:
        store.dispose()
