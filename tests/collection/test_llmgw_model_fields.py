"""llmgw.cluster.llmgw_model's comparison (module_utils/llmgw_catalog.py) against the
catalog's own parsing and the store the control service answers from: every catalog field
is an option, a declared entry compares equal to what the server stores for it (so a second
run changes nothing), and an entry the server refuses never does (so it is sent and refused).
Fast: the catalog, fleet layer and models_view in process, on SQLite; the real module runs
in test_llmgw_model.py."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from llmgw_runtime.api.catalog import Autoscale
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.catalog.scale import AUTOSCALE_FIELDS
from llmgw_runtime.control import fleet
from llmgw_runtime.errors import CatalogError
from llmgw_runtime.store import Store
from tests.collection.conftest import COLLECTIONS

if str(COLLECTIONS) not in sys.path:
    sys.path.append(str(COLLECTIONS))
module = importlib.import_module("ansible_collections.llmgw.cluster.plugins.modules.llmgw_model")
compare = importlib.import_module(
    "ansible_collections.llmgw.cluster.plugins.module_utils.llmgw_catalog")

OTHER = {"name": "other", "source": "/srv/other.gguf", "engine": "llama.cpp",
         "profile": {"class": "cpu"}}
FULL = {"replicas": {"min": 1, "max": 3},
        "autoscale": {"wait_target_s": 5, "up_after_s": "2m", "busy_below": 0.25,
                      "down_after_s": "15m", "cooldown_s": 90},
        "routing": "least-outstanding", "slots": 4, "max_queue": 10, "max_wait_s": 20,
        "aliases": ["gpt-4o-mini", "small"], "fallback": ["other"], "strategy": "spread",
        "sha256": "AB" * 32, "size_bytes": 1234, "args": ["--ctx-size", 512]}


def params(**fields: Any) -> dict[str, Any]:
    """The module's parameters for a task that declares ``fields``, typed and filled in by
    its argument_spec as AnsibleModule does."""
    task = {"name": "qwen", "source": "file:///srv/models/qwen.gguf", "engine": "llama.cpp",
            "profile": {"class": "cpu"}, "control_url": "http://127.0.0.1:1",
            "token": "llmgw-admin-test", **fields}
    result = ArgumentSpecValidator(module.argument_spec()).validate(task)
    assert not result.error_messages, result.error_messages
    return dict(result.validated_parameters)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path_factory.mktemp('store')}/llmgw.db")
    s.migrate()
    yield s
    s.dispose()


def apply_and_read(store: Store, entry: dict[str, Any]) -> dict[str, Any]:
    """Apply ``entry`` (with ``other`` beside it) as PUT /api/v1/catalog does; the model as
    GET /api/v1/models/<name> shows it."""
    specs = catalog.validate({"models": [OTHER, entry]})
    with store.begin() as conn:
        fleet.apply_catalog(conn, specs, 0.0, prune=True)
        [model] = [m for m in fleet.models_view(conn, 0.0) if m["name"] == entry["name"]]
    return model


def test_the_module_has_an_option_for_every_catalog_field() -> None:
    spec = module.argument_spec()

    assert Path(module.__file__).is_relative_to(COLLECTIONS), "not this repository's module"
    assert set(catalog.MODEL_FIELDS) <= set(spec)
    assert set(spec["autoscale"]["options"]) == set(AUTOSCALE_FIELDS)
    assert set(catalog.MODEL_FIELDS) - {"name", "source", "engine", "profile"} \
        == set(compare.OPTIONAL)


def test_the_defaults_the_module_assumes_are_the_catalogs() -> None:
    defaults = {f.name: f.default if f.default is not dataclasses.MISSING
                else f.default_factory() for f in dataclasses.fields(catalog.ModelSpec)
                if f.name not in ("name", "source", "engine", "profile")}
    defaults = {k: list(v) if isinstance(v, tuple) else v for k, v in defaults.items()}

    assert compare.AUTOSCALE_DEFAULTS == Autoscale().to_dict()
    assert {k: defaults[k] for k in compare.DEFAULTS} == compare.DEFAULTS
    assert set(compare.FIELDS) - {"name", "source", "engine", "profile"} == set(defaults)


@pytest.mark.parametrize("fields", [
    pytest.param({}, id="every-default"),
    pytest.param(FULL, id="every-field"),
    pytest.param({"replicas": {"min": 0, "max": 3}, "idle_stop_after": "30m"},
                 id="on-demand-range-autoscale-defaulted"),
    pytest.param({"replicas": {"min": 0, "max": 3}, "on_demand": True},
                 id="on-demand-range-said-twice"),
    pytest.param({"replicas": {"min": 0, "max": 1}}, id="range-that-does-not-scale"),
    pytest.param({"replicas": {"min": 2, "max": 2}}, id="range-of-one-number"),
    pytest.param({"replicas": "3"}, id="templated-number"),
    pytest.param({"replicas": {"min": "1", "max": "4"}, "autoscale": {"cooldown_s": "1h"}},
                 id="templated-range-one-setting"),
    pytest.param({"replicas": {"min": 1, "max": 4}, "autoscale": {}}, id="empty-autoscale"),
    pytest.param({"on_demand": True, "replicas": 2, "idle_stop_after": 90},
                 id="on-demand-number"),
    pytest.param({"replicas": 0}, id="stopped"),
    pytest.param({"routing": "prefix-affinity", "max_queue": 100, "max_wait_s": 30,
                  "strategy": "binpack", "aliases": [], "fallback": []},
                 id="defaults-said-out-loud"),
])
def test_a_declared_entry_compares_equal_to_what_the_server_stores(
        store: Store, fields: dict[str, Any]) -> None:
    entry, declared = compare.declared(params(**fields))

    model = apply_and_read(store, entry)

    assert compare.differences(compare.stored(model), declared) == []


@pytest.mark.parametrize(("kept", "refused", "why"), [
    ({"replicas": {"min": 0, "max": 3}}, {"replicas": {"min": 0, "max": 3}, "on_demand": False},
     "replicas.min 0 means on demand"),
    ({"replicas": 2, "on_demand": True}, {"replicas": {"min": 2, "max": 2}, "on_demand": True},
     "on_demand: true is the same as replicas.min 0"),
    ({"replicas": {"min": 1, "max": 3}}, {"replicas": {"min": 1, "max": 3}, "on_demand": True},
     "on_demand: true is the same as replicas.min 0"),
    ({"replicas": 1}, {"replicas": True}, "replicas must be a whole number or a range"),
    ({"replicas": 2}, {"replicas": 2, "autoscale": {}}, "autoscale applies to a model"),
    ({"replicas": {"min": 0, "max": 1}},
     {"replicas": {"min": 0, "max": 1}, "autoscale": {"cooldown_s": 30}},
     "autoscale applies to a model"),
    ({}, {"idle_stop_after": "30m"}, "idle_stop_after applies only to on_demand models"),
    ({"replicas": {"min": 1, "max": 3}},
     {"replicas": {"min": 1, "max": 3}, "autoscale": {"busy_below": 30}},
     "autoscale.busy_below must be a share"),
])
def test_an_entry_the_server_refuses_never_equals_the_stored_model(
        store: Store, kept: dict[str, Any], refused: dict[str, Any], why: str) -> None:
    model = apply_and_read(store, compare.declared(params(**kept))[0])
    entry, declared = compare.declared(params(**refused))

    with pytest.raises(CatalogError) as exc:
        catalog.validate({"models": [entry]})

    assert any(why in d for d in exc.value.details), exc.value.details
    assert compare.differences(compare.stored(model), declared) != []


def test_a_field_the_server_does_not_show_counts_as_its_default(store: Store) -> None:
    """A control service older than a field answers without it: no change is reported
    for a task that leaves the field out."""
    entry, declared = compare.declared(params())
    model = apply_and_read(store, entry)
    for key in ("routing", "slots", "max_queue", "max_wait_s", "aliases", "fallback",
                "replicas_max", "autoscale"):
        model.pop(key)

    assert compare.differences(compare.stored(model), declared) == []
