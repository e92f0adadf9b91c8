"""Revision 0008 on both backends: a store at 0007 with a model and a key keeps them, with
the admission defaults and normal priority; the settings round-trip; it downgrades."""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.store import Store, accounts, repo
from llmgw_runtime.store.db import MIGRATIONS
from llmgw_runtime.store.models import row_to_spec

CAT = """models:
  - {name: a, source: /a.gguf, engine: llama.cpp, profile: {class: cpu}, slots: 4,
     routing: least-outstanding, max_queue: 0, max_wait_s: 2.5}
  - {name: b, source: /b.gguf, engine: vllm, profile: {class: a100-80g}}
"""


def head() -> str:
    """The newest migration (what ``Store.migrate`` moves a store to): each new revision
    moves it, so no test names it."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return str(ScriptDirectory.from_config(cfg).get_current_head())


def alembic(store: Store, verb: str, revision: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, verb)(cfg, revision)


def test_a_store_at_0007_keeps_its_rows_with_the_defaults(store_url: str) -> None:
    store = Store(store_url)
    try:
        alembic(store, "upgrade", "0007")
        with store.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO models (name, source, engine, profile, replicas, on_demand, "
                "args, definition_hash, parked, consecutive_failures, created, updated) "
                "VALUES ('old', '/o.gguf', 'llama.cpp', '{\"class\": \"cpu\"}', 1, 0, '[]', "
                "'h', 0, 0, 1, 1)"))
            conn.execute(sa.text(
                "INSERT INTO accounts (name, kind, token_hash, is_admin, created) "
                "VALUES ('key:app', 'api_key', 'x', 0, 1)"))
        assert store.migrate() == head()
        with store.begin() as conn:
            row = repo.get_model(conn, "old")
            assert row is not None
            spec = row_to_spec(row)
            [key] = accounts.accounts_of_kind(conn, "api_key")
        assert (row.routing, row.slots, row.max_queue, row.max_wait_s) == (
            "prefix-affinity", None, 100, 30.0)
        assert (row.capacity_at, row.capacity) == (None, None)
        assert (spec.routing, spec.slots, spec.max_queue, spec.max_wait_s) == (
            "prefix-affinity", None, 100, 30.0)
        assert key.priority == "normal"
        alembic(store, "downgrade", "0007")
        with store.engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("models")}
        assert "slots" not in columns and "routing" not in columns
    finally:
        store.dispose()


def test_admission_settings_round_trip_and_a_change_is_an_update(store: Store) -> None:
    with store.begin() as conn:
        repo.apply_catalog(conn, catalog.parse(CAT), 1.0)
        a = row_to_spec(repo.get_model(conn, "a"))
        again = repo.apply_catalog(conn, catalog.parse(CAT), 2.0)
        changed = repo.apply_catalog(conn, catalog.parse(CAT.replace("max_queue: 0",
                                                                     "max_queue: 5")), 3.0)
        shown = repo.model_to_dict(repo.get_model(conn, "a"))
    assert a == catalog.parse(CAT)[0]
    assert again["unchanged"] == ["a", "b"] and changed["updated"] == ["a"]
    assert {k: shown[k] for k in ("routing", "slots", "max_queue", "max_wait_s")} == {
        "routing": "least-outstanding", "slots": 4, "max_queue": 5, "max_wait_s": 2.5}


def test_key_priority_is_stored_and_changed(store: Store) -> None:
    with store.begin() as conn:
        accounts.put_account(conn, "key:vip", "api_key", "h1", 1.0, priority="high")
        accounts.put_account(conn, "key:app", "api_key", "h2", 1.0)
        before = accounts.update_key(conn, "key:app", "api_key", priority="low")
        missing = accounts.update_key(conn, "key:nope", "api_key", priority="low")
        rows = {r.name: r.priority for r in accounts.accounts_of_kind(conn, "api_key")}
    assert before is not None and before.priority == "normal" and missing is None
    assert rows == {"key:vip": "high", "key:app": "low"}


def test_a_capacity_report_is_stored_with_the_model(store: Store) -> None:
    with store.begin() as conn:
        repo.apply_catalog(conn, catalog.parse(CAT), 1.0)
        repo.update_model(conn, "b", capacity_at=5.0, capacity=json.dumps({"waiting": 2}))
        shown = repo.model_to_dict(repo.get_model(conn, "b"))
    assert (shown["capacity_at"], shown["capacity"]) == (5.0, {"waiting": 2})
