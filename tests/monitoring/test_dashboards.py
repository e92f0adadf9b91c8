"""The Grafana dashboards (monitoring/dashboards/) as committed: what the generator writes,
in the JSON a current Grafana reads, and naming only metrics llmgw's services export.
tests/integration/test_dashboards.py runs each of their queries against a real Prometheus
scraping a real control service and router."""

from __future__ import annotations

import re
from typing import Any

from .support import all_queries, committed, exported_series, generator, unexported

BUILTIN_VARIABLES = {"__rate_interval", "__range", "__interval"}
MATCHER_WITH_VARIABLE = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"[^"]*\$\{?(\w+)')


def test_the_committed_dashboards_are_what_the_generator_writes() -> None:
    written = generator().files()
    on_disk = {name: (generator().OUT / name).read_text() for name in committed()}
    assert sorted(on_disk) == sorted(written), \
        "monitoring/dashboards/ holds other files than make_dashboards.py writes"
    stale = [name for name, text in written.items() if on_disk[name] != text]
    assert not stale, (f"{stale} differ from monitoring/make_dashboards.py's description: run "
                       ".venv/bin/python monitoring/make_dashboards.py and commit the JSON")
    assert generator().main(["--check"]) == 0


def test_every_query_names_only_metrics_llmgw_exports() -> None:
    queries = all_queries()
    assert len(queries) > 60
    assert not unexported(queries), "\n".join(unexported(queries))
    # together they show every family the two services export
    read = {exported_series()[n] for _, q in queries for n in generator().metric_names(q)}
    assert set(exported_series().values()) - read == set()


def test_a_query_naming_a_metric_no_service_exports_is_caught() -> None:
    # a counter without its _total, a histogram without _bucket, a name made up
    bad = [("p / A", "sum(rate(llmgw_router_requests[5m]))"),
           ("p / B", "histogram_quantile(0.9, rate(llmgw_router_queue_wait_seconds[5m]))"),
           ("p / C", "llmgw_model_ready_replicas + llmgw_model_readiness")]
    assert unexported(bad) == ["p / A: llmgw_router_requests",
                               "p / B: llmgw_router_queue_wait_seconds",
                               "p / C: llmgw_model_readiness"]


def _panels(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in doc["panels"] if p["type"] != "row"]


def test_the_dashboards_are_grafana_json_with_a_prometheus_variable_and_llmgw_tags() -> None:
    docs = committed()
    assert sorted(docs) == ["llmgw-fleet.json", "llmgw-keys.json", "llmgw-models.json"]
    for name, doc in docs.items():
        assert doc["uid"] + ".json" == name and doc["title"].startswith("llmgw / ")
        assert 39 <= doc["schemaVersion"] <= 41 and "llmgw" in doc["tags"]
        assert "id" not in doc                    # Grafana gives one on import
        variables = {v["name"]: v for v in doc["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for var in variables.values():
            if var["type"] == "query":
                assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
                assert generator().LABEL_VALUES_RE.match(var["definition"]), var["definition"]
                assert var["includeAll"] and var["multi"] and var["allValue"] == ".*"
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids))
        for panel in _panels(doc):
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["description"] and panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"] == panel["datasource"]
                used = set(re.findall(r"\$\{?(\w+)", target["expr"]))
                assert used <= set(variables) | BUILTIN_VARIABLES, (panel["title"], used)
                # a multi-value variable is a regex: matched with =~, never =
                for label, op, var in MATCHER_WITH_VARIABLE.findall(target["expr"]):
                    assert op == "=~", f"{name} {panel['title']}: {label}{op}${var}"
    models = {v["name"] for v in docs["llmgw-models.json"]["templating"]["list"]}
    keys = {v["name"] for v in docs["llmgw-keys.json"]["templating"]["list"]}
    fleet = {v["name"] for v in docs["llmgw-fleet.json"]["templating"]["list"]}
    assert "model" in models and {"key", "model"} <= keys and {"class", "node"} <= fleet


def test_panels_fit_the_grid_without_overlapping() -> None:
    for name, doc in committed().items():
        taken: dict[tuple[int, int], str] = {}
        for panel in doc["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, (name, panel["title"])
            for x in range(pos["x"], pos["x"] + pos["w"]):
                for y in range(pos["y"], pos["y"] + pos["h"]):
                    assert (x, y) not in taken, \
                        f"{name}: {panel['title']} overlaps {taken[(x, y)]}"
                    taken[(x, y)] = panel["title"]


def test_the_keys_dashboard_shows_refusals_per_key() -> None:
    """Issue 29: refusals per key, from the usage the routers report (the routers' own
    counters have no key label); no panel says refusals by key are not available."""
    doc = committed()["llmgw-keys.json"]
    panel = next(p for p in _panels(doc) if p["title"] == "Refusals per key")
    [target] = panel["targets"]
    assert target["expr"].startswith("sum by (key) ")
    assert "llmgw_usage_refused_total{" in target["expr"]
    assert target["legendFormat"] == "{{key}}"
    text = str(committed()).lower()
    assert "not per key" not in text and "not available" not in text
