"""What the dashboards' tests share: the generator (monitoring/make_dashboards.py, a script
outside the package, loaded from its file), the dashboards as committed, and the series
names llmgw's services export (read from their source, as tests/test_doc_metrics.py does)."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.test_doc_metrics import MODULES, exported

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "monitoring" / "make_dashboards.py"
DASHBOARDS = ROOT / "monitoring" / "dashboards"
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


@cache
def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llmgw_make_dashboards", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module           # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def committed() -> dict[str, dict[str, Any]]:
    """File name -> the dashboard JSON as committed."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def all_queries() -> list[tuple[str, str]]:
    """(dashboard file: panel / refId, PromQL) of every committed dashboard."""
    make = generator()
    return [(f"{name}: {where}", query) for name, doc in committed().items()
            for where, query in make.queries(doc)]


def _histograms(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
                and re.search(r"Histogram", getattr(node.func, "id", "")
                              or getattr(node.func, "attr", ""))):
            found.add(str(node.args[0].value))
    return found


@cache
def exported_series() -> dict[str, str]:
    """Every series name the services export -> its family (a histogram's ``_bucket``,
    ``_sum`` and ``_count`` -> the histogram; a counter's ``_total`` is its name)."""
    names = {n for m in MODULES for n in exported(m)}
    histograms = {h for m in MODULES for h in _histograms(m)}
    series = {n: n for n in names - histograms}
    series.update({h + s: h for h in histograms for s in HISTOGRAM_SERIES})
    return series


def unexported(queries: list[tuple[str, str]]) -> list[str]:
    """``where: name`` for each metric a query names that no llmgw service exports."""
    known = exported_series()
    return [f"{where}: {name}" for where, query in queries
            for name in sorted(generator().metric_names(query)) if name not in known]
