"""llmgw.cluster.llmgw_model against the catalog entry's one definition (api/catalog.py).

The collection runs on hosts without llmgw_runtime, so its field names, defaults and
documentation are literals (module_utils/llmgw_catalog.py, the module's DOCUMENTATION with its
doc fragment doc_fragments/llmgw_catalog.py, and argument_spec). These tests are what keeps
them the entry's: a field of ``ModelSpec`` (or of a nested entry: profile, autoscale,
max_tokens, rollout) missing from any of them, one of them naming a field the entry does not
have, or a default that differs, fails here. Then the behaviour: a declared entry compares
equal to what the server stores for it (so a second run changes nothing), and an entry the
server refuses never does (so it is sent and refused). Fast: the catalog, fleet layer and
models_view in process, on SQLite; the real module runs in test_llmgw_model.py."""

from __future__ import annotations

import importlib
import re
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.utils.plugin_docs import merge_fragment
from pydantic import BaseModel

from llmgw_runtime.api.catalog import (
    MODEL_FIELDS,
    Frozen,
    ModelSpec,
    Profile,
    default,
    extra,
)
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.catalog.spec import DURATION_RE
from llmgw_runtime.control import fleet
from llmgw_runtime.errors import CatalogError
from llmgw_runtime.store import Store
from tests.collection.conftest import COLLECTIONS

if str(COLLECTIONS) not in sys.path:
    sys.path.append(str(COLLECTIONS))
module = importlib.import_module("ansible_collections.llmgw.cluster.plugins.modules.llmgw_model")
compare = importlib.import_module(
    "ansible_collections.llmgw.cluster.plugins.module_utils.llmgw_catalog")
README = COLLECTIONS / "ansible_collections" / "llmgw" / "cluster" / "README.md"

# The module's own options: how it reaches the control service, and what it does.
CONNECTION = {"control_url", "token", "ca_path", "validate_certs", "timeout", "state"}


# ------------------------------------------------------------ the entry, read generically

def catalog_fields(cls: type[BaseModel] = ModelSpec) -> dict[str, str]:
    """The catalog's name of each field of ``cls`` -> the field (api/catalog.py
    ``catalog_names``: ``idle_stop_after`` -> ``idle_stop_after_s``, ``class`` -> ``klass``;
    ``replicas_max`` is written inside ``replicas`` and has no name of its own)."""
    out = {}
    for name, info in cls.model_fields.items():
        meta = extra(cls, name)
        if "catalog" in meta and meta["catalog"] is None:
            continue
        out[meta.get("catalog_name", info.alias or name)] = name
    return out


def nested(cls: type[BaseModel] = ModelSpec) -> dict[str, type[BaseModel]]:
    """The catalog name of each field of ``cls`` that is an entry of its own -> its class."""
    out = {}
    for key, name in catalog_fields(cls).items():
        annotation = cls.model_fields[name].annotation
        for kind in (annotation, *typing.get_args(annotation)):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                out[key] = kind
    return out


def required(cls: type[BaseModel] = ModelSpec) -> set[str]:
    return {k for k, n in catalog_fields(cls).items() if cls.model_fields[n].is_required()}


def stored_default(name: str, cls: type[BaseModel] = ModelSpec) -> Any:
    """A field's default as the admin API shows it (JSON: lists, mappings)."""
    value = default(name, cls)
    if isinstance(value, Frozen):
        return value.to_dict()
    return list(value) if isinstance(value, tuple) else value


def documented(value: Any) -> str:
    """A default as the module's documentation writes it."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"C({value})"
    return f"{value:g}"


def options() -> dict[str, Any]:
    """The module's options as ansible-doc shows them: its DOCUMENTATION's, with those of each
    doc fragment it extends merged in (the catalog fields', doc_fragments/llmgw_catalog.py).
    An option is documented in one place only, the module or a fragment."""
    doc = yaml.safe_load(module.DOCUMENTATION)
    merged = dict(doc["options"])
    for name in doc.get("extends_documentation_fragment", []):
        collection, _, fragment = name.rpartition(".")
        assert collection == "llmgw.cluster", name
        plugin = importlib.import_module(
            f"ansible_collections.llmgw.cluster.plugins.doc_fragments.{fragment}")
        said = dict(yaml.safe_load(plugin.ModuleDocFragment.DOCUMENTATION)["options"])
        assert set(said).isdisjoint(merged), (name, sorted(set(said) & set(merged)))
        merge_fragment(merged, said)
    return merged


def text(option: dict[str, Any]) -> str:
    description = option.get("description", "")
    lines = [description] if isinstance(description, str) else description
    return " ".join(" ".join(lines).split())


# ------------------------------------------------------------ names and defaults

def test_the_module_is_this_repositorys() -> None:
    assert Path(module.__file__).is_relative_to(COLLECTIONS)
    assert Path(compare.__file__).is_relative_to(COLLECTIONS)


def test_the_compared_fields_are_the_entrys_as_the_server_stores_them() -> None:
    assert len(set(compare.FIELDS)) == len(compare.FIELDS)
    assert set(compare.FIELDS) == set(MODEL_FIELDS)


def test_every_optional_catalog_field_is_sent_when_the_task_sets_it() -> None:
    assert len(set(compare.OPTIONAL)) == len(compare.OPTIONAL)
    assert set(compare.OPTIONAL) == set(catalog_fields()) - required()


def test_the_defaults_the_module_assumes_are_the_entrys() -> None:
    assert compare.DEFAULTS == {name: stored_default(name) for name in MODEL_FIELDS
                                if not ModelSpec.model_fields[name].is_required()}


@pytest.mark.parametrize("field", sorted(set(nested()) - required()))
def test_each_optional_nested_entry_has_its_settings_defaults_in_the_module(
        field: str) -> None:
    """``autoscale`` -> ``AUTOSCALE_DEFAULTS``, ``max_tokens`` -> ``MAX_TOKENS_DEFAULTS``:
    what the server fills in for a setting the task leaves out."""
    cls = nested()[field]
    settings = getattr(compare, f"{field.upper()}_DEFAULTS", None)

    assert settings is not None, f"module_utils/llmgw_catalog.py has no {field.upper()}_DEFAULTS"
    assert settings == {k: stored_default(n, cls) for k, n in catalog_fields(cls).items()}


def test_the_profile_the_module_fills_in_is_the_entrys() -> None:
    """normal_profile() sets each of PROFILE_SIZES to 1 and drops a setting left unset."""
    defaults = {k: default(n, Profile) for k, n in catalog_fields(Profile).items()
                if k not in required(Profile)}

    assert set(compare.PROFILE_SIZES) == {k for k, v in defaults.items() if v == 1}
    assert {v for k, v in defaults.items() if k not in compare.PROFILE_SIZES} <= {None}


def test_durations_are_read_as_the_server_reads_them() -> None:
    assert compare._DURATION_RE.pattern == DURATION_RE.pattern


# ------------------------------------------------------------ options and documentation

def test_the_module_has_an_option_for_every_catalog_field_and_no_other() -> None:
    spec = module.argument_spec()

    assert set(spec) - CONNECTION == set(catalog_fields())
    for field, cls in nested().items():
        assert set(spec[field]["options"]) == set(catalog_fields(cls)), field
        for name in required(cls):
            assert spec[field]["options"][name].get("required") is True, (field, name)


def test_the_documentation_has_every_option_of_the_argument_spec_as_typed() -> None:
    def same(doc: dict[str, Any], spec: dict[str, Any], where: str) -> None:
        assert set(doc) == set(spec), where
        for name, option in spec.items():
            said = doc[name]
            at = f"{where}{name}"
            assert said.get("type", "str") == option.get("type", "str"), at
            assert said.get("elements") == option.get("elements"), at
            assert bool(said.get("required")) == bool(option.get("required")), at
            assert said.get("default") == option.get("default"), at
            assert text(said), f"{at} has no description"
            if "options" in option or "suboptions" in said:
                same(said.get("suboptions", {}), option.get("options", {}), f"{at}.")

    same(options(), module.argument_spec(), "")


def _defaults_to_document() -> Iterator[tuple[str, dict[str, Any], Any]]:
    """(option, its documentation, the server's default) of every catalog field and nested
    setting whose default is a value (not none, not an empty list)."""
    docs = options()
    for where, cls, doc in [("", ModelSpec, docs),
                            *((f"{k}.", c, docs.get(k, {}).get("suboptions", {}))
                              for k, c in nested().items())]:
        for key, name in catalog_fields(cls).items():
            if cls.model_fields[name].is_required():
                continue
            value = default(name, cls)
            if value is not None and value != ():
                yield f"{where}{key}", doc.get(key, {}), value    # {}: undocumented


@pytest.mark.parametrize(("option", "doc", "value"),
                         [pytest.param(*case, id=case[0]) for case in _defaults_to_document()])
def test_each_option_documents_the_servers_default(option: str, doc: dict[str, Any],
                                                   value: Any) -> None:
    said = re.compile(rf"The server's default is {re.escape(documented(value))}(?!\w|\.\d)")

    assert said.search(text(doc)), (option, text(doc))


def test_the_returned_model_shows_every_field() -> None:
    sample = yaml.safe_load(module.RETURN)["model"]["sample"]

    assert set(MODEL_FIELDS) <= set(sample)


def test_the_readme_names_every_catalog_field() -> None:
    readme = README.read_text()

    assert [k for k in catalog_fields() if f"`{k}`" not in readme] == []


# ------------------------------------------------------------ the comparison

OTHER = {"name": "other", "source": "/srv/other.gguf", "engine": "llama.cpp",
         "profile": {"class": "cpu"}}
FULL = {"replicas": {"min": 1, "max": 3},
        "autoscale": {"wait_target_s": 5, "up_after_s": "2m", "busy_below": 0.25,
                      "down_after_s": "15m", "cooldown_s": 90},
        "routing": "least-outstanding", "slots": 4, "max_queue": 10, "max_wait_s": 20,
        "aliases": ["gpt-4o-mini", "small"], "fallback": ["other"], "strategy": "spread",
        "sha256": "AB" * 32, "size_bytes": 1234, "args": ["--ctx-size", 512],
        "max_tokens": {"default": 256, "max": 4096, "clamp": True},
        "rollout": {"max_surge": 2, "max_unavailable": 1, "canary_percent": 10},
        "drain_timeout_s": "5m"}


def test_the_every_field_case_declares_every_optional_field() -> None:
    """A range that scales rules out on_demand and idle_stop_after; the on-demand cases
    below declare them."""
    assert set(FULL) | {"on_demand", "idle_stop_after"} == set(compare.OPTIONAL)


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
    pytest.param({"max_tokens": {"max": 4096}}, id="max-tokens-one-setting"),
    pytest.param({"max_tokens": {"default": "512", "clamp": "yes"}},
                 id="max-tokens-templated"),
    pytest.param({"max_tokens": {}}, id="max-tokens-empty"),
    pytest.param({"rollout": {"max_unavailable": 1}}, id="rollout-one-setting"),
    pytest.param({"rollout": {"max_surge": "0", "max_unavailable": "1"}},
                 id="rollout-templated"),
    pytest.param({"rollout": {}}, id="rollout-empty"),
    pytest.param({"drain_timeout_s": "2m"}, id="drain-timeout-duration"),
    pytest.param({"drain_timeout_s": 45}, id="drain-timeout-number"),
    pytest.param({"drain_timeout_s": "90"}, id="drain-timeout-templated"),
    pytest.param({"routing": "prefix-affinity", "max_queue": 100, "max_wait_s": 30,
                  "strategy": "binpack", "aliases": [], "fallback": [],
                  "max_tokens": {"default": None, "max": None, "clamp": False},
                  "rollout": {"max_surge": 1, "max_unavailable": 0, "canary_percent": 0},
                  "drain_timeout_s": 120},
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
    ({"max_tokens": {"default": 100, "max": 100}},
     {"max_tokens": {"default": 5000, "max": 100}},
     "max_tokens default (5000) is above max (100)"),
    ({"max_tokens": {"max": 10_000_000}}, {"max_tokens": {"max": 10_000_001}},
     "max_tokens.max must be at most 10000000"),
    ({"rollout": {"max_surge": 0, "max_unavailable": 1}},
     {"rollout": {"max_surge": 0, "max_unavailable": 0}},
     "max_surge and max_unavailable are both 0"),
    ({"rollout": {"canary_percent": 99}}, {"rollout": {"canary_percent": 100}},
     "canary_percent"),
    ({"drain_timeout_s": "1d"}, {"drain_timeout_s": "2d"}, "drain_timeout_s"),
    ({"drain_timeout_s": 120}, {"drain_timeout_s": "2 minutes"}, "drain_timeout_s"),
])
def test_an_entry_the_server_refuses_never_equals_the_stored_model(
        store: Store, kept: dict[str, Any], refused: dict[str, Any], why: str) -> None:
    model = apply_and_read(store, compare.declared(params(**kept))[0])
    entry, declared = compare.declared(params(**refused))

    with pytest.raises(CatalogError) as exc:
        catalog.validate({"models": [entry]})

    assert any(why in d for d in exc.value.details), exc.value.details
    assert compare.differences(compare.stored(model), declared) != []


def test_a_changed_max_tokens_setting_is_one_changed_field(store: Store) -> None:
    model = apply_and_read(store, compare.declared(params(max_tokens={"max": 4096}))[0])
    _, declared = compare.declared(params(max_tokens={"max": 4096, "clamp": True}))

    assert compare.differences(compare.stored(model), declared) == ["max_tokens"]


def test_a_changed_rollout_setting_is_one_changed_field(store: Store) -> None:
    model = apply_and_read(store, compare.declared(params(rollout={"max_unavailable": 1}))[0])
    _, same = compare.declared(params(rollout={"max_surge": 1, "max_unavailable": 1}))
    _, surged = compare.declared(params(rollout={"max_surge": 2, "max_unavailable": 1}))
    _, unset = compare.declared(params())

    assert compare.differences(compare.stored(model), same) == []
    assert compare.differences(compare.stored(model), surged) == ["rollout"]
    assert compare.differences(compare.stored(model), unset) == ["rollout"]


def test_a_drain_timeout_is_compared_in_seconds(store: Store) -> None:
    model = apply_and_read(store, compare.declared(params(drain_timeout_s="2m"))[0])
    _, seconds = compare.declared(params(drain_timeout_s=120))
    _, unset = compare.declared(params())
    _, longer = compare.declared(params(drain_timeout_s="10m"))

    assert model["drain_timeout_s"] == 120.0
    assert compare.differences(compare.stored(model), seconds) == []
    assert compare.differences(compare.stored(model), unset) == []     # 120 s: the default
    assert compare.differences(compare.stored(model), longer) == ["drain_timeout_s"]


def test_a_field_the_server_does_not_show_counts_as_its_default(store: Store) -> None:
    """A control service older than a field answers without it: no change is reported
    for a task that leaves the field out."""
    entry, declared = compare.declared(params())
    model = apply_and_read(store, entry)
    for key in ("routing", "slots", "max_queue", "max_wait_s", "aliases", "fallback",
                "replicas_max", "autoscale", "max_tokens", "rollout", "drain_timeout_s"):
        model.pop(key)

    assert compare.differences(compare.stored(model), declared) == []
