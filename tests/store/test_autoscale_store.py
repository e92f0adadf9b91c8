"""Revision 0012 on both backends: a store at 0011 keeps its models as fixed replicas; a
replica range, its autoscale settings and the autoscaler's columns round-trip; it
downgrades to 0011 without them."""

from __future__ import annotations

import json

import sqlalchemy as sa

from llmgw_runtime.api.catalog import Autoscale
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.control.autoscale import scaled
from llmgw_runtime.store import Store, repo
from llmgw_runtime.store.models import row_to_spec

from .test_admission_store import alembic

COLUMNS = {"replicas_max", "autoscale", "load", "scale_target", "scale_state"}
CAT = """models:
  - {name: a, source: /a.gguf, engine: llama.cpp, profile: {class: cpu},
     replicas: {min: 0, max: 3}, autoscale: {up_after_s: 10s, busy_below: 0.2}}
  - {name: b, source: /b.gguf, engine: llama.cpp, profile: {class: cpu}, replicas: 2}
"""


def model_columns(store: Store) -> set[str]:
    with store.engine.connect() as conn:
        return {c["name"] for c in sa.inspect(conn).get_columns("models")}


def test_a_store_at_0011_upgrades_keeps_its_models_fixed_and_downgrades(store_url: str) -> None:
    store = Store(store_url)
    try:
        alembic(store, "upgrade", "0011")
        with store.engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO models (name, source, engine, profile, replicas, on_demand, "
                "args, definition_hash, parked, consecutive_failures, created, updated) "
                "VALUES ('old', '/o.gguf', 'llama.cpp', '{\"class\": \"cpu\"}', 2, 0, '[]', "
                "'h', 0, 0, 1, 1)"))
        alembic(store, "upgrade", "head")   # 0012 and the revisions after it
        assert COLUMNS <= model_columns(store)
        with store.begin() as conn:
            row = repo.get_model(conn, "old")
            assert row is not None and scaled(row) is None
            spec = row_to_spec(row)
            assert (spec.replicas, spec.replicas_max, spec.autoscale) == (2, None, None)

            repo.apply_catalog(conn, catalog.parse(CAT), 2.0)
            repo.update_model(conn, "a", scale_target=2, load=json.dumps({"posts": []}),
                              scale_state=json.dumps({"last_at": 3.0}))
            a, b = repo.get_model(conn, "a"), repo.get_model(conn, "b")
            spec = row_to_spec(a)
            assert (spec.replicas, spec.replicas_max, spec.on_demand) == (0, 3, True)
            assert spec.autoscale == Autoscale(up_after_s=10.0, busy_below=0.2)
            assert (a.scale_target, json.loads(a.scale_state)) == (2, {"last_at": 3.0})
            assert row_to_spec(b).replicas_max is None
            # the same catalog again changes nothing: the stored settings compare equal
            assert repo.apply_catalog(conn, catalog.parse(CAT), 3.0)["unchanged"] == ["a", "b"]
        alembic(store, "downgrade", "0011")
        assert not COLUMNS & model_columns(store)
        with store.engine.connect() as conn:
            names = {r[0] for r in conn.execute(sa.text("SELECT name FROM models"))}
        assert names == {"old", "a", "b"}
    finally:
        store.dispose()
