"""Fallback models in the catalog (issue 17): a list of model names, each a model of the
fleet, not the model itself; refused naming what is wrong."""

from __future__ import annotations

import pytest

from llmgw_runtime.api.router import Routes
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.errors import CatalogError

from .conftest import ROUTER, Api
from .test_aliases import cat


def test_fallbacks_are_kept_and_carried_to_routers(api: Api) -> None:
    text = cat(("big", ", fallback: [small]"), ("small", ""))
    assert [s.fallback for s in catalog.parse(text)] == [("small",), ()]
    assert api.call("PUT", "/api/v1/catalog", data=text).status_code == 200
    routes = Routes.model_validate(api.call("GET", "/api/v1/routes", token=ROUTER).json)
    assert {m.name: m.fallback for m in routes.models} == {"big": ("small",), "small": ()}
    # a later catalog (no --prune) may fall back to a model the store keeps
    more = api.call("PUT", "/api/v1/catalog", data=cat(("huge", ", fallback: [small]")))
    assert more.status_code == 200 and more.json["created"] == ["huge"]


def test_a_fallback_that_names_no_model_is_refused(api: Api) -> None:
    resp = api.call("PUT", "/api/v1/catalog", data=cat(("big", ", fallback: [nosuch]")))
    assert resp.status_code == 400
    assert "fallback nosuch is not a model of the catalog" in " ".join(
        resp.json["error"]["details"])
    assert api.call("GET", "/api/v1/models").json["models"] == []


@pytest.mark.parametrize(("more", "says"), [
    (", fallback: small", "fallback must be a list of model names"),
    (", fallback: [a]", "fallback 'a' is the model itself"),
    (", fallback: [b, b]", "fallback 'b' is listed twice"),
    (", fallback: ['no way']", "fallback 'no way' is not a model name"),
    (", fallback: [" + ", ".join(f"m{i}" for i in range(9)) + "]",
     "9 fallback models, over the maximum of 8"),
])
def test_a_bad_fallback_list_is_refused_naming_it(more: str, says: str) -> None:
    with pytest.raises(CatalogError) as refused:
        catalog.parse(cat(("a", more), ("b", "")))
    assert any(says in line for line in refused.value.details), refused.value.details
