"""``ctl status`` at a large fleet counts the nodes and names the first with problems
(bounded: the screen does not grow with the fleet); ``--nodes`` lists every node."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa

from llmgw_runtime.store import Store
from llmgw_runtime.store.schema import nodes
from tests.cli.test_commands import control, ctl  # noqa: F401 - the fixture

NODES = 300
DEVICE = {"id": 0, "card": 0, "mig": None, "class": "cpu", "memory_total_mb": 16000,
          "memory_used_mb": 100, "healthy": True, "reason": None}


def test_status_names_problem_nodes_bounded_and_nodes_lists_them_all(
        control: str, store: Store) -> None:  # noqa: F811
    now = time.time()
    sick = {**DEVICE, "healthy": False, "reason": "XID 79"}
    with store.begin() as conn:
        conn.execute(nodes.insert(), [
            {"name": f"node-{i:03d}", "fabric": "ib-a", "engines": "[]", "weights": "{}",
             "hardware": "{}", "created": now,
             "devices": json.dumps([sick if i % 20 == 3 else DEVICE]),
             "last_report": now - (3600 if i % 10 == 7 else 1)} for i in range(NODES)])
    code, out = ctl(control, "status")
    assert code == 0, out
    # 30 silent (i % 10 == 7), 15 with an unhealthy device (i % 20 == 3): 45 in all
    assert "nodes 270/300 reporting (30 silent)" in out
    assert "nodes with problems (45):" in out
    assert "node-003  1 unhealthy device: XID 79" in out
    assert "node-007  silent for 1h" in out
    assert "... and 35 more (llmgw ctl status --nodes)" in out
    assert "node-299" not in out and len(out.splitlines()) < 60
    code, listed = ctl(control, "status", "--nodes")
    assert code == 0 and "nodes (300):" in listed
    lines = [ln for ln in listed.splitlines() if ln.strip().startswith("node-")]
    assert len([ln for ln in lines if ln.split()[1] == "ib-a"]) == NODES
    assert any(ln.split()[:4] == ["node-003", "ib-a", "-", "0/1"] for ln in lines)
    as_json = json.loads(ctl(control, "status", "--nodes", "-o", "json")[1])
    assert len(as_json["node_list"]) == NODES and as_json["node_problems"]["total"] == 45
    assert len(as_json["node_problems"]["nodes"]) == 45
    with store.begin() as conn:       # 60 more silent nodes: the list stops at 50
        conn.execute(nodes.update().where(nodes.c.name.in_(
            [f"node-{i:03d}" for i in range(NODES) if i % 5 == 0])).values(
                last_report=sa.literal(now - 600)))
    summary = json.loads(ctl(control, "status", "-o", "json")[1])["node_problems"]
    assert summary["total"] == 105 and len(summary["nodes"]) == 50
    assert summary["nodes"][0] == {"name": "node-000", "problem": "silent for 10m"}
