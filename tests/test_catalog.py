"""Catalog validation: each rule, and every problem reported at once."""

from __future__ import annotations

import pytest

from llmgw_runtime import catalog
from llmgw_runtime.errors import CatalogError


def entry(**over: object) -> dict[str, object]:
    base: dict[str, object] = {"name": "qwen", "source": "file:///m/qwen.gguf",
                               "engine": "llama.cpp", "profile": {"class": "a100-80g"}}
    base.update(over)
    return base


def problems(*entries: object) -> list[str]:
    with pytest.raises(CatalogError) as info:
        catalog.validate({"models": list(entries)})
    return info.value.details


def test_a_good_entry_gets_defaults() -> None:
    [spec] = catalog.validate({"models": [entry()]})
    assert spec.replicas == 1 and not spec.on_demand and spec.args == ()
    assert spec.profile.gpus == spec.profile.tp == spec.profile.pp == spec.profile.nodes == 1


def test_unknown_engine_names_model_and_field() -> None:
    [msg] = problems(entry(engine="tgi"))
    assert "models[0] (qwen)" in msg and "engine 'tgi' is unknown" in msg
    assert "llama.cpp, vllm" in msg


def test_tp_times_pp_must_equal_gpus_times_nodes() -> None:
    [msg] = problems(entry(profile={"class": "h100-80g", "gpus": 4, "tp": 2, "pp": 1}))
    assert "tp x pp (2 x 1) must equal gpus x nodes (4 x 1)" in msg


@pytest.mark.parametrize("field", ["gpus", "tp", "pp", "nodes"])
def test_mig_class_refuses_more_than_one_of_anything(field: str) -> None:
    profile = {"class": "a100-80g-mig-3g.40gb", "gpus": 1, "tp": 1, "pp": 1, "nodes": 1}
    profile[field] = 2
    msgs = problems(entry(profile=profile))
    assert any(f"profile.{field} is 2" in m and "exactly one instance" in m for m in msgs)


@pytest.mark.parametrize("name", ["has space", "/leading", ".hidden", "", "tab\tname"])
def test_names_the_router_cannot_route_are_refused(name: str) -> None:
    [msg] = problems(entry(name=name))
    assert "cannot be routed" in msg


def test_names_with_org_slash_are_routable() -> None:
    [spec] = catalog.validate({"models": [entry(name="Qwen/Qwen2.5-7B-Instruct")]})
    assert spec.name == "Qwen/Qwen2.5-7B-Instruct"


def test_unknown_fields_are_named_with_the_known_ones() -> None:
    msgs = problems(entry(colour="red", profile={"class": "cpu", "gpu": 1}))
    assert any("colour is not a known field" in m for m in msgs)
    assert any("profile.gpu is not a known field" in m and "gpus" in m for m in msgs)


def test_every_problem_is_reported_at_once_across_entries() -> None:
    msgs = problems(entry(engine="x"), entry(name="b", source="relative/path",
                                              replicas=-1), entry(name="qwen"))
    assert len(msgs) == 4
    assert any("models[1] (b): source" in m for m in msgs)
    assert any("models[1] (b): replicas must be at least 0" in m for m in msgs)
    assert any("also used by models[0]" in m for m in msgs)


def test_booleans_must_be_real_booleans() -> None:
    [msg] = problems(entry(on_demand="yes"))
    assert "on_demand must be true or false" in msg


def test_idle_stop_after_needs_on_demand_and_a_duration() -> None:
    assert any("applies only to on_demand" in m for m in problems(entry(idle_stop_after="5m")))
    assert any("not a duration" in m
               for m in problems(entry(on_demand=True, idle_stop_after="soon")))
    [spec] = catalog.validate({"models": [entry(on_demand=True, idle_stop_after="30m")]})
    assert spec.idle_stop_after_s == 1800


def test_malformed_yaml_says_where() -> None:
    with pytest.raises(CatalogError) as info:
        catalog.parse("models:\n  - name: a\n    profile: {class: cpu\n")
    assert "not valid YAML at line" in info.value.message


def test_a_document_without_models_says_how_to_write_it() -> None:
    with pytest.raises(CatalogError) as info:
        catalog.parse("- name: a\n")
    assert "'models' list" in info.value.message


def test_definition_hash_changes_with_args_not_with_replicas() -> None:
    [a] = catalog.validate({"models": [entry()]})
    [b] = catalog.validate({"models": [entry(replicas=3)]})
    [c] = catalog.validate({"models": [entry(args=["--ctx-size", "4096"])]})
    assert a.definition_hash == b.definition_hash != c.definition_hash


@pytest.mark.parametrize("over, words", [
    ({"strategy": "random"}, "strategy 'random' is unknown; use binpack"),
    ({"source": "https://x/m.gguf", "sha256": "abc"}, "sha256 must be 64 hexadecimal digits"),
    ({"source": "https://x/m.gguf", "size_bytes": 0}, "size_bytes must be at least 1"),
    ({"source": "hf://Org/Repo/m.gguf", "sha256": "a" * 64},
     "huggingface_hub checks hf:// downloads itself"),
])
def test_placement_and_download_fields_are_checked(over: dict[str, object], words: str) -> None:
    assert any(words in m for m in problems(entry(**over)))


def test_checksum_is_part_of_the_definition_but_strategy_is_not() -> None:
    base = {"source": "https://x/m.gguf"}
    [plain] = catalog.validate({"models": [entry(**base)]})
    [spread] = catalog.validate({"models": [entry(strategy="spread", **base)]})
    [summed] = catalog.validate({"models": [entry(sha256="A" * 64, **base)]})
    assert spread.strategy == "spread" and spread.definition_hash == plain.definition_hash
    assert summed.sha256 == "a" * 64 and summed.definition_hash != plain.definition_hash
