"""``ctl keys`` with priorities, and ``ctl status`` showing a model at capacity."""

from __future__ import annotations

import json
import time

from llmgw_runtime.store import Store, repo
from tests.cli.test_commands import control, ctl  # noqa: F401 - the fixture

CATALOG = """models:
  - {name: tiny, source: file:///models/tiny.gguf, engine: llama.cpp, profile: {class: cpu},
     slots: 2, max_queue: 10}
"""


def test_ctl_keys_create_list_and_set_priority(control: str) -> None:  # noqa: F811
    code, out = ctl(control, "keys", "create", "vip", "--priority", "high")
    assert code == 0 and "API key vip (high priority) (shown once" in out
    assert ctl(control, "keys", "create", "app")[0] == 0
    code, out = ctl(control, "keys", "list")
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:]}
    assert out.splitlines()[0].split() == ["NAME", "PRIORITY", "MODELS", "EXPIRES", "RPM", "TPM",
                                         "CREATED"]
    assert rows == {"app": "normal", "vip": "high"}
    code, out = ctl(control, "keys", "set", "app", "--priority", "low")
    assert code == 0 and "API key app: priority low" in out
    data = json.loads(ctl(control, "keys", "list", "-o", "json")[1])
    assert {k["name"]: k["priority"] for k in data["keys"]} == {"app": "low", "vip": "high"}


def test_ctl_keys_refuse_an_unknown_priority_before_asking(control: str) -> None:  # noqa: F811
    code, out = ctl(control, "keys", "create", "x", "--priority", "urgent")
    assert code == 2 and "'urgent' is not one of 'high', 'normal', 'low'" in out
    code, out = ctl(control, "keys", "set", "nope", "--priority", "low")
    assert code == 1 and "there is no API key named 'nope'" in out


def test_ctl_status_shows_a_model_at_capacity(control: str, store: Store) -> None:  # noqa: F811
    from llmgw_runtime.catalog import parse as catalog
    from llmgw_runtime.control import fleet

    with store.begin() as conn:
        fleet.apply_catalog(conn, catalog.parse(CATALOG), time.time(), prune=False)
        now = store.now(conn)
        repo.update_model(conn, "tiny", capacity_at=now - 2, capacity=json.dumps(
            {"since": now - 10, "reports": 4, "waiting": 3, "in_flight": 2, "slots": 2,
             "rejected": 5, "wait_p90_s": 1.2}))
    code, out = ctl(control, "status")
    assert code == 0
    [line] = [ln for ln in out.splitlines() if ln.strip().startswith("tiny ")
              and "at capacity" in ln]
    assert "3 waiting, 5 refused in the last 10 s" in line     # clipped to 80 columns
    assert "at capacity (1):" in out
    data = json.loads(ctl(control, "status", "-o", "json")[1])
    assert data["at_capacity"][0]["name"] == "tiny"
    assert data["models"][0]["at_capacity"]["rejected"] == 5
    models = json.loads(ctl(control, "models", "-o", "json")[1])["models"]
    assert (models[0]["slots"], models[0]["max_queue"], models[0]["routing"]) == (
        2, 10, "prefix-affinity")


def test_ctl_models_shows_each_models_max_tokens(control: str, store: Store) -> None:  # noqa: F811
    from llmgw_runtime.catalog import parse as catalog
    from llmgw_runtime.control import fleet

    capped = """models:
  - {name: capped, source: file:///models/c.gguf, engine: llama.cpp, profile: {class: cpu},
     max_tokens: {default: 256, max: 4096, clamp: true}}
  - {name: most, source: file:///models/m.gguf, engine: llama.cpp, profile: {class: cpu},
     max_tokens: {max: 512}}
  - {name: free, source: file:///models/f.gguf, engine: llama.cpp, profile: {class: cpu}}
"""
    with store.begin() as conn:
        fleet.apply_catalog(conn, catalog.parse(capped), time.time(), prune=False)
    code, out = ctl(control, "models")
    assert code == 0
    lines = {ln.split()[0]: ln for ln in out.splitlines()[1:] if ln.strip()}
    assert "MAX TOKENS" in out.splitlines()[0]
    assert "256 of 4096 + clamp" in lines["capped"]
    assert lines["most"].split()[-1] == "512" and " of 512" not in lines["most"]
    data = json.loads(ctl(control, "models", "-o", "json")[1])["models"]
    assert {m["name"]: m["max_tokens"] for m in data} == {
        "capped": {"default": 256, "max": 4096, "clamp": True},
        "most": {"default": None, "max": 512, "clamp": False}, "free": None}
