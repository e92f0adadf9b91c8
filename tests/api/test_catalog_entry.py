"""The one definition of a catalog entry (api/catalog.py): what derives from it stays equal
to it, a stored model keeps its definition across the change, and a field added to the
entry without its column is caught."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from llmgw_runtime.api.catalog import (
    MODEL_FIELDS,
    ROUTE_FIELDS,
    Autoscale,
    MaxTokens,
    ModelSpec,
    Profile,
    bounds,
    catalog_names,
    default,
    to_router,
)
from llmgw_runtime.api.router import RouteModel
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.store.models import SPEC_COLUMNS, row_to_spec, spec_to_row
from llmgw_runtime.store.schema import models as models_table


def entry(**over: Any) -> dict[str, Any]:
    return {"name": "qwen", "source": "/m.gguf", "engine": "llama.cpp",
            "profile": {"class": "cpu"}, **over}


def problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(Exception) as info:
        catalog.validate({"models": [raw]})
    return list(getattr(info.value, "details", []))


def full_spec() -> ModelSpec:
    """A spec with every field away from its default."""
    return ModelSpec(
        name="chat", source="/m.gguf", engine="vllm",
        profile=Profile.model_validate({"class": "a100-80g", "gpus": 2, "tp": 2,
                                        "memory_gb": 40.0}),
        replicas=2, replicas_max=4, on_demand=False, idle_stop_after_s=None,
        args=("--x", "1"), strategy="spread", sha256="a" * 64, size_bytes=5, slots=8,
        routing="least-outstanding", max_queue=7, max_wait_s=2.5, aliases=("gpt",),
        fallback=("small",), autoscale=Autoscale(up_after_s=10.0, busy_below=0.2),
        max_tokens=MaxTokens(default=256, max=1024, clamp=True))


def test_the_definition_hash_of_a_stored_model_is_what_it_was_before_the_typed_entry() -> None:
    """Digests computed with the dataclass ModelSpec of before issue 26: a new hash would
    make every stored model look like a new definition (unparked, relaunched)."""
    plain = ModelSpec(name="m", source="/m.gguf", engine="llama.cpp",
                      profile=Profile.model_validate({"class": "cpu"}))
    assert plain.definition_hash == \
        "378c69ec9657e8e6068b90883d0b1d4bd7cf701eb7dc452f625b5354f65b0faa"
    full = full_spec().model_copy(update={"source": "/m.gguf", "args": ("--x", "1")})
    assert full.definition_hash == \
        "87573ba49c76febc213ab0a4cfc20e0bd6db0f3b314c1c8f4f91d916480864a9"


def test_routing_settings_are_not_part_of_the_definition() -> None:
    spec = full_spec()
    changed = spec.model_copy(update={"max_queue": 1, "routing": "prefix-affinity",
                                      "max_tokens": None, "aliases": ()})
    assert changed.definition_hash == spec.definition_hash
    assert spec.model_copy(update={"slots": 4}).definition_hash != spec.definition_hash


def test_every_field_survives_the_store_round_trip() -> None:
    spec = full_spec()
    row = SimpleNamespace(name=spec.name, **spec_to_row(spec))
    assert row_to_spec(row) == spec
    assert row.definition_hash == spec.definition_hash


def test_a_null_column_reads_as_the_fields_default() -> None:
    row = spec_to_row(ModelSpec(name="m", source="/m.gguf", engine="llama.cpp",
                                profile=Profile.model_validate({"class": "cpu"})))
    nulls = {k: None for k in SPEC_COLUMNS if k not in ("source", "engine", "profile")}
    spec = row_to_spec(SimpleNamespace(name="m", **{**row, **nulls}))
    assert all(getattr(spec, k) == default(k) for k in nulls)


def test_every_field_of_the_entry_has_its_column_in_the_store() -> None:
    """A field added to api/catalog.py needs a column (and a migration): this fails first."""
    assert set(SPEC_COLUMNS) <= set(models_table.c.keys())


def test_the_routes_table_carries_the_route_fields_as_defined() -> None:
    spec = full_spec()
    route = RouteModel(**to_router(spec), state="ready")
    assert {k: getattr(route, k) for k in ROUTE_FIELDS} == \
        {k: getattr(spec, k) for k in ROUTE_FIELDS}
    assert set(ROUTE_FIELDS) <= set(MODEL_FIELDS)


def test_the_catalog_writes_fields_by_their_catalog_names() -> None:
    names = catalog_names()
    assert "idle_stop_after" in names and "idle_stop_after_s" not in names
    assert "replicas_max" not in names and "max_tokens" in names
    assert catalog_names(Profile)[0] == "class"


def test_defaults_and_bounds_come_from_the_entry() -> None:
    [spec] = catalog.validate({"models": [entry()]})
    assert (spec.max_queue, spec.max_wait_s, spec.max_tokens) == (
        default("max_queue"), default("max_wait_s"), None)
    high = bounds("max_queue")["le"]
    [msg] = problems(entry(max_queue=high + 1))
    assert f"max_queue must be at most {high}" in msg


def test_max_tokens_is_parsed_with_its_defaults() -> None:
    [spec] = catalog.validate({"models": [entry(max_tokens={"default": 256, "max": 4096})]})
    assert spec.max_tokens == MaxTokens(default=256, max=4096, clamp=False)
    [only_max] = catalog.validate({"models": [entry(max_tokens={"max": 10, "clamp": True})]})
    assert only_max.max_tokens == MaxTokens(max=10, clamp=True)


@pytest.mark.parametrize(("value", "says"), [
    ({"default": 5000, "max": 4096}, "max_tokens default (5000) is above max (4096)"),
    ({"max": 0}, "max_tokens.max must be at least 1, not 0"),
    ({"max": 10_000_001}, "max_tokens.max must be at most 10000000 (llmgw's MAX_TOKENS_CAP)"),
    ({"default": "256"}, "max_tokens.default must be a whole number, not '256'"),
    ({"clamp": "yes"}, "max_tokens.clamp must be true or false, not 'yes'"),
    ({"maximum": 5}, "max_tokens.maximum is not a known field; known: default, max, clamp"),
    (4096, "max_tokens must be a mapping like {default: ..., max: ..., clamp: ...}, not 4096"),
])
def test_a_bad_max_tokens_names_the_model_the_field_and_the_fix(value: Any, says: str) -> None:
    [msg] = problems(entry(max_tokens=value))
    assert msg.startswith("models[0] (qwen): ") and says in msg, msg
