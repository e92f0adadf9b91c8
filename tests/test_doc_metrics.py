"""Every metric the control service and the router export is in docs/api.md's metric
tables, under the name Prometheus scrapes (a counter ends in ``_total``), and every metric
those tables list is exported. The store's Patroni and etcd metrics were once exported
without a line of documentation (issue 15: the etcd voters' health on ``/metrics``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = [ROOT / "llmgw_runtime" / "control" / "metrics.py",
           ROOT / "llmgw_runtime" / "control" / "autoscale_metrics.py",
           ROOT / "llmgw_runtime" / "control" / "rollout_metrics.py",
           ROOT / "llmgw_runtime" / "control" / "usage_metrics.py",
           ROOT / "llmgw_runtime" / "router" / "metrics.py"]
DOCUMENTED = re.compile(r"^\| `(llmgw_[a-z0-9_]+)` \|", re.M)


def exported(path: Path) -> dict[str, str]:
    """Metric name as scraped -> where it is made: the first argument of each metric
    constructor (``Counter``, ``GaugeMetricFamily``, ...), and the names of a table of
    gauges (``(name, help, ...)`` tuples)."""
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        name = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (re.search(r"Counter|Gauge|Histogram|Summary", called)
                    and isinstance(first, ast.Constant) and isinstance(first.value, str)):
                name = first.value + ("_total" if "Counter" in called
                                      and not first.value.endswith("_total") else "")
        elif (isinstance(node, ast.Tuple) and node.elts and isinstance(node.elts[0], ast.Constant)
              and isinstance(node.elts[0].value, str)
              and re.fullmatch(r"llmgw_[a-z0-9_]+", node.elts[0].value)):
            name = node.elts[0].value
        if name:
            found.setdefault(name, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_the_reader_finds_the_metrics_of_both_services() -> None:
    names = {n for m in MODULES for n in exported(m)}
    assert {"llmgw_leader", "llmgw_device_power_watts", "llmgw_store_etcd_member_healthy",
            "llmgw_router_requests_total", "llmgw_router_slots_in_use"} <= names


def test_every_exported_metric_is_documented_and_every_documented_one_exported() -> None:
    made = {n: w for m in MODULES for n, w in exported(m).items()}
    documented = set(DOCUMENTED.findall((ROOT / "docs" / "api.md").read_text()))
    undocumented = [f"{n} ({w})" for n, w in sorted(made.items()) if n not in documented]
    assert not undocumented, ("exported but not in docs/api.md's metric tables: "
                              + ", ".join(undocumented))
    assert not documented - set(made), \
        f"in docs/api.md but exported by neither service: {sorted(documented - set(made))}"
