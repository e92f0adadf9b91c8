"""Console pages that would list thousands of rows come a page at a time (``?page=N``,
200 rows, links to the previous and next page, "201–300 of 300"): nodes, replicas, models
and the summary's models table. Paging is the console's, not the store's: SQLite only
(test_console.py runs the pages on both backends)."""

from __future__ import annotations

import json
import re
import time

import pytest

from llmgw_runtime.api.catalog import ModelSpec, Profile
from llmgw_runtime.store import repo
from llmgw_runtime.store.schema import nodes, replicas

from .conftest import Api
from .test_console import login

NODES, MODELS = 300, 250


@pytest.fixture
def store_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('store')}/llmgw.db"


@pytest.fixture
def big(api: Api) -> Api:
    """300 nodes (node-000 ... node-299) and 250 models (model-000 ... model-249), one
    replica each."""
    now = time.time()
    devices = json.dumps([{"id": 0, "card": 0, "mig": None, "class": "cpu",
                           "memory_total_mb": 16000, "memory_used_mb": 100, "healthy": True,
                           "reason": None}])
    with api.store.begin() as conn:
        conn.execute(nodes.insert(), [
            {"name": f"node-{i:03d}", "fabric": "ib-a", "devices": devices,
             "engines": '["llama.cpp"]', "weights": "{}", "hardware": "{}", "created": now,
             "last_report": now} for i in range(NODES)])
        repo.apply_catalog(conn, [ModelSpec(name=f"model-{i:03d}",
                                            source=f"file:///m/{i}.gguf", engine="llama.cpp",
                                            profile=Profile(klass="cpu"))
                                  for i in range(MODELS)], now)
        conn.execute(replicas.insert(), [
            {"id": f"r-{i:03d}", "model": f"model-{i:03d}", "node": f"node-{i:03d}",
             "devices": "[0]", "state": "ready", "desired": 1, "started": now,
             "updated": now} for i in range(MODELS)])
    login(api)
    return api


def rows(html: str, pattern: str) -> list[str]:
    return re.findall(pattern, html)


def test_nodes_come_a_page_at_a_time_with_the_count_and_links(big: Api) -> None:
    first = big.client.get("/console/nodes").get_data(as_text=True)
    second = big.client.get("/console/nodes?page=2").get_data(as_text=True)
    names = rows(first, r'<tbody class="node[^"]*" id="node-(node-\d+)"')
    assert names == [f"node-{i:03d}" for i in range(200)]
    assert rows(second, r'<tbody class="node[^"]*" id="node-(node-\d+)"') == [
        f"node-{i:03d}" for i in range(200, 300)]
    assert "1–200 of 300" in first and "201–300 of 300" in second
    assert 'href="/console/nodes?page=2">next' in first
    assert 'href="/console/nodes?page=1">« previous' in second and "next »" not in second
    for asked, shown in [("99", "201–300 of 300"), ("0", "1–200 of 300"),
                         ("-3", "1–200 of 300"), ("abc", "1–200 of 300")]:
        resp = big.client.get(f"/console/nodes?page={asked}")   # clamped, not an error
        assert resp.status_code == 200 and shown in resp.get_data(as_text=True), asked


def test_models_and_the_summarys_models_table_are_paged(big: Api) -> None:
    models = big.client.get("/console/models").get_data(as_text=True)
    assert len(rows(models, r'<tr id="model-model-\d+"')) == 200
    assert "1–200 of 250" in models and 'href="/console/models?page=2"' in models
    last = big.client.get("/console/models?page=2").get_data(as_text=True)
    assert rows(last, r'<tr id="model-(model-\d+)"') == [f"model-{i:03d}"
                                                         for i in range(200, 250)]
    summary = big.client.get("/console/").get_data(as_text=True)
    assert len(rows(summary, r'<tr id="summary-model-model-\d+"')) == 200
    assert "1–200 of 250" in summary and "300</b>/300 nodes reporting" in summary
    second = big.client.get("/console/?page=2").get_data(as_text=True)
    assert 'id="summary-model-model-249"' in second
    assert 'id="summary-model-model-000"' not in second
    second = big.client.get("/console/replicas?page=2").get_data(as_text=True)
    assert "201–250 of 250" in second
    assert 'id="replica-r-249"' in second and 'id="replica-r-000"' not in second
