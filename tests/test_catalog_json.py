"""A catalog written as JSON is read with the JSON decoder, within the same bounds and to the
same models as its YAML; ``ctl apply`` and ``llmgw up`` send JSON when the YAML reads as plain
data, the text as written when it does not (catalog/bounds.py ``load_json``, ``wire``)."""

from __future__ import annotations

import json

import pytest
import yaml

from bench.harness import catalog_json
from llmgw_runtime.catalog import bounds
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.errors import CatalogError

YAML_CATALOG = """\
models:
  - name: chat            # a comment JSON cannot hold
    source: file:///m/chat.gguf
    engine: llama.cpp
    profile: {class: a100-80g, gpus: 1, memory_gb: 20.5}
    replicas: 2
    aliases: [talk]
    args: ["--ctx-size", "4096"]
  - name: batch
    source: hf://org/batch/batch.gguf
    engine: llama.cpp
    profile: {class: cpu}
    on_demand: true
    idle_stop_after: 30m
"""


def test_the_same_catalog_as_json_and_as_yaml_gives_the_same_models() -> None:
    doc = yaml.safe_load(YAML_CATALOG)
    as_json = catalog.parse(json.dumps(doc, indent=2))
    assert as_json == catalog.parse(YAML_CATALOG)
    assert [s.definition_hash for s in as_json] == \
        [s.definition_hash for s in catalog.parse(YAML_CATALOG)]
    big = catalog_json(1000, 2).decode()         # control_bench's catalog
    assert bounds.load_json(big) == yaml.load(big, Loader=bounds._LOADER)  # noqa: S506


@pytest.mark.parametrize("levels", [17, 100_000])
def test_json_nested_deeper_than_the_bound_is_refused_naming_it(levels: int) -> None:
    text = '{"models": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"
    with pytest.raises(CatalogError) as info:
        catalog.parse(text)
    assert "nests deeper than 16 levels (MAX_DEPTH)" in info.value.message


def test_json_and_yaml_count_the_same_levels() -> None:
    """16 levels pass the depth bound either way (the entry is then refused for what it
    is, not for its depth); 17 do not."""
    for levels, refused in ((16, False), (17, True)):
        for text in ('{"models": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}",
                     "models: " + "[" * (levels - 1) + "]" * (levels - 1)):
            with pytest.raises(CatalogError) as info:
                catalog.parse(text)
            assert ("MAX_DEPTH" in info.value.message) is refused, (text[:20], levels)


@pytest.mark.parametrize("text", [
    pytest.param("{models: []}", id="a YAML flow mapping"),
    pytest.param('{"models": [NaN]}', id="a constant JSON does not have"),
    pytest.param("# a comment\n{\"models\": []}", id="YAML around JSON"),
])
def test_text_that_is_not_json_is_read_as_yaml(text: str) -> None:
    assert bounds.load_json(text) is bounds.NOT_JSON
    assert bounds.load_yaml(text) == yaml.safe_load(text)


def test_a_json_catalog_over_the_size_bound_is_refused_before_it_is_read() -> None:
    text = '{"models": [], "x": "' + "x" * (4 * 1024 * 1024) + '"}'
    with pytest.raises(CatalogError) as info:
        bounds.load_json(text)
    assert "(MAX_CATALOG_BYTES)" in info.value.message


def test_a_client_sends_json_when_the_yaml_reads_as_plain_data() -> None:
    body, content_type = bounds.wire(YAML_CATALOG)
    assert content_type == "application/json"
    assert json.loads(body) == yaml.safe_load(YAML_CATALOG)


@pytest.mark.parametrize("text", [
    pytest.param("models:\n  - name: a\n    profile: {class: cpu\n", id="not YAML"),
    pytest.param("models: []\nwhen: 2026-12-07\n", id="a date JSON cannot hold"),
    pytest.param("models: []\nlimit: .inf\n", id="an infinity JSON cannot hold"),
    pytest.param("a: &a " + "x" * 1000 + "\nb: [" + "*a, " * 5000 + "*a]\nmodels: []\n",
                 id="aliases that expand past the size bound as JSON"),
])
def test_a_client_sends_what_json_cannot_hold_as_written(text: str) -> None:
    """The control service then reads it and says what is wrong with it, with the line."""
    assert bounds.wire(text) == (text.encode(), "application/yaml")
