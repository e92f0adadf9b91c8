"""``llmgw ctl usage --gpu-hours`` (issue 29) against a real control service: device-hours
per model or key and device class, with their cost, as a table and as the API's JSON."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.security import hash_token
from llmgw_runtime.store import Store, devicetime
from llmgw_runtime.store.schema import usage
from tests.cli.test_commands import ctl
from tests.control.conftest import ADMIN, JOIN, ROUTER, served

CATALOG = """models:
  - {name: chat, source: file:///m/chat.gguf, engine: vllm, profile: {class: h100-80g}}
  - {name: embed, source: file:///m/embed.gguf, engine: llama.cpp, profile: {class: cpu}}
"""


@pytest.fixture
def priced(store: Store, tmp_path: Path) -> Iterator[str]:
    config = ControlConfig(state_dir=tmp_path, admin_token=ADMIN, join_token=JOIN,
                           router_token=ROUTER, cost_per_device_hour="h100-80g=2.5")
    bootstrap(store, config)
    with served(create_app(config, store_=store)) as url:
        yield url


def _call(url: str, method: str, path: str, token: str = ADMIN, **kw: Any) -> Any:
    resp = requests.request(method, url + path, timeout=10,
                            headers={"Authorization": f"Bearer {token}"}, **kw)
    assert resp.status_code in (200, 201), resp.text
    return resp.json()


def test_ctl_usage_gpu_hours_shows_hours_and_cost_per_key_and_model(
        priced: str, store: Store) -> None:
    _call(priced, "PUT", "/api/v1/catalog", data=CATALOG)
    app = hash_token(_call(priced, "POST", "/api/v1/keys", json={"name": "app"})["key"])
    _call(priced, "POST", "/api/v1/usage", ROUTER, json={"reporter": "r-1", "seq": 1,
                                                         "entries": [
        {"key": app, "model": "chat", "requests": 3, "prompt_tokens": 250,
         "completion_tokens": 50},
        {"key": "-", "model": "chat", "requests": 1, "prompt_tokens": 100,
         "completion_tokens": 0}]})
    with store.begin() as conn:        # the hour the report was booked in, and the one before
        hour = conn.execute(sa.select(usage.c.bucket)).scalars().first()
        devicetime.add(conn, {(hour, "chat", "h100-80g"): 7200.0,
                              (hour - 3600, "chat", "h100-80g"): 1800.0,
                              (hour, "embed", "cpu"): 900.0})
    code, out = ctl(priced, "usage", "--gpu-hours")
    assert code == 0, out
    assert [line.split() for line in out.splitlines()] == [
        ["KEY", "MODEL", "CLASS", "DEVICE-HOURS", "COST"],
        ["-", "chat", "h100-80g", "0.500", "1.25"],        # 1/4 of chat's tokens
        ["app", "chat", "h100-80g", "1.500", "3.75"],      # 3/4 of its 2 device-hours
        ["(unattributed)", "chat", "h100-80g", "0.500", "1.25"],   # the hour before
        ["(unattributed)", "embed", "cpu", "0.250", "-"]]          # no price for cpu
    code, out = ctl(priced, "usage", "--gpu-hours", "--by", "model", "--since", "7d")
    assert [line.split() for line in out.splitlines()][1:] == [
        ["chat", "h100-80g", "2.500", "6.25"], ["embed", "cpu", "0.250", "-"]]
    code, out = ctl(priced, "usage", "--gpu-hours", "--by", "key", "-o", "json")
    data = json.loads(out)
    assert data["by"] == "key" and data["rows"] == [
        {"key": "-", "device_class": "h100-80g", "device_hours": 0.5, "cost": 1.25},
        {"key": "app", "device_class": "h100-80g", "device_hours": 1.5, "cost": 3.75}]
    assert [(r["model"], r["device_hours"]) for r in data["unattributed"]] == [
        ("chat", 0.5), ("embed", 0.25)]
