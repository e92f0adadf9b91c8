"""Model aliases (issue 17): other names clients may use for a model. An alias names one
model only: the catalog, and the catalog with what the store keeps, refuse a clash."""

from __future__ import annotations

import pytest

from llmgw_runtime.api.router import Routes
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.errors import CatalogError

from .conftest import ROUTER, Api

ENTRY = "  - {{name: {name}, source: /m.gguf, engine: llama.cpp, profile: {{class: cpu}}{more}}}\n"


def cat(*entries: tuple[str, str]) -> str:
    return "models:\n" + "".join(ENTRY.format(name=n, more=m) for n, m in entries)


def test_aliases_are_parsed_kept_and_carried_to_routers(api: Api) -> None:
    text = cat(("chat", ", aliases: [gpt-4o-mini, assistant]"), ("embed", ""))
    assert [s.aliases for s in catalog.parse(text)] == [("gpt-4o-mini", "assistant"), ()]
    assert api.call("PUT", "/api/v1/catalog", data=text).json["created"] == ["chat", "embed"]
    routes = Routes.model_validate(api.call("GET", "/api/v1/routes", token=ROUTER).json)
    assert {m.name: m.aliases for m in routes.models} == {
        "chat": ("gpt-4o-mini", "assistant"), "embed": ()}
    # a change of aliases is an update, not a new definition; the same again is nothing
    changed = api.call("PUT", "/api/v1/catalog", data=cat(("chat", ", aliases: [assistant]"),
                                                          ("embed", ""))).json
    assert changed["updated"] == ["chat"]
    again = api.call("PUT", "/api/v1/catalog", data=cat(("chat", ", aliases: [assistant]"),
                                                        ("embed", ""))).json
    assert again["updated"] == [] and again["unchanged"] == ["chat", "embed"]


@pytest.mark.parametrize(("entries", "says"), [
    ((("a", ", aliases: [b]"), ("b", "")), "alias b is already the name of model b"),
    ((("a", ", aliases: [x]"), ("b", ", aliases: [x]")), "alias x is already an alias of model a"),
    ((("a", ", aliases: [a]"),), "alias 'a' is the model's own name"),
    ((("a", ", aliases: [x, x]"),), "alias 'x' is listed twice"),
    ((("a", ", aliases: ['has space']"),), "alias 'has space' cannot be routed"),
    ((("a", ", aliases: x"),), "aliases must be a list of names"),
    ((("a", ", aliases: [" + ", ".join(f"n{i}" for i in range(17)) + "]"),),
     "17 aliases, over the maximum of 16"),
])
def test_a_bad_alias_is_refused_naming_it(entries: tuple[tuple[str, str], ...],
                                          says: str) -> None:
    with pytest.raises(CatalogError) as refused:
        catalog.parse(cat(*entries))
    assert any(says in line for line in refused.value.details), refused.value.details


def test_an_alias_that_clashes_with_a_model_the_store_keeps_is_refused(api: Api) -> None:
    assert api.call("PUT", "/api/v1/catalog", data=cat(("old", ""))).status_code == 200
    clash = cat(("new", ", aliases: [old]"))
    resp = api.call("PUT", "/api/v1/catalog", data=clash)
    assert resp.status_code == 400
    assert "alias old is already the name of model old" in " ".join(
        resp.json["error"]["details"])
    assert [m["name"] for m in api.call("GET", "/api/v1/models").json["models"]] == ["old"]
    # with --prune the old model goes, and its name is free for the alias
    pruned = api.call("PUT", "/api/v1/catalog?prune=true", data=clash)
    assert pruned.status_code == 200 and pruned.json["deleted"] == ["old"]
