"""A property-based fuzzer of what agents, routers and admins send the control service:
every input gets a 2xx or a 4xx, never a 5xx, and after any sequence of bad reports from
one node the reconciler still places a new model on the other nodes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.control.reconcile import Reconciler
from llmgw_runtime.store import Store

from .conftest import ADMIN, CPU, JOIN, ROUTER

FUZZ = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**80, max_value=2**80)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=40)
           | st.sampled_from(["", "\x1b[2J", "a" * 300, "ready", "cpu", "127.0.0.1",
                              "r-0", "../../etc/passwd", "Infinity"]))
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=20)
REPORT_KEYS = ["node", "address", "agent_version", "fabric", "devices", "device_problems",
               "device_source", "driver_version", "cards", "engines", "replicas", "weights",
               "sources_hash", "stopping"]
DEVICE_KEYS = list(CPU) + ["processes", "temperature_c", "profile"]


def raw_json(value: Any) -> bytes:
    """JSON as a sender may write it, NaN and Infinity included."""
    return json.dumps(value, allow_nan=True).encode()


@st.composite
def bad_reports(draw: st.DrawFn) -> bytes:
    """Mostly well-formed reports with one or more fields replaced by anything; sometimes
    anything at all, sometimes bytes that are not JSON."""
    kind = draw(st.sampled_from(["field", "device", "replica", "any", "bytes"]))
    report: dict[str, Any] = {"node": "bad", "address": "127.0.0.1", "devices": [dict(CPU)],
                              "engines": ["llama.cpp"]}
    if kind == "field":
        for key in draw(st.lists(st.sampled_from(REPORT_KEYS), min_size=1, max_size=3)):
            report[key] = draw(JSON)
        report.setdefault("node", "bad")
    elif kind == "device":
        report["devices"][0][draw(st.sampled_from(DEVICE_KEYS))] = draw(JSON)
    elif kind == "replica":
        report["replicas"] = [{"id": draw(st.text(max_size=20) | st.just("r-1")),
                               "state": draw(st.sampled_from(["ready", "failed", "x"]) | JSON),
                               "port": draw(JSON), "pid": draw(JSON),
                               "progress": draw(JSON)}]
    elif kind == "any":
        return raw_json(draw(JSON))
    else:
        return draw(st.binary(max_size=200))
    return raw_json(report)


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.store = Store(f"sqlite:///{tmp / 'llmgw.db'}")
        self.store.migrate()
        self.config = ControlConfig(state_dir=tmp, admin_token=ADMIN, join_token=JOIN,
                                    router_token=ROUTER)
        bootstrap(self.store, self.config)
        self.client = create_app(self.config, store_=self.store).test_client()
        self.reconciler = Reconciler(self.store, self.config, holder="fuzz")
        self.creds = {name: self.post("/api/v1/agent/join", JOIN, raw_json({"node": name})
                                      ).get_json()["credential"] for name in ("good", "bad")}
        for name in self.creds:
            assert self.report(name, raw_json({"node": name, "address": "127.0.0.1",
                                               "devices": [CPU]})).status_code == 200

    def post(self, path: str, token: str, body: bytes, method: str = "POST") -> Any:
        return self.client.open(path, method=method, data=body,
                                headers={"Authorization": f"Bearer {token}",
                                         "Content-Type": "application/json"})

    def report(self, node: str, body: bytes) -> Any:
        return self.post("/api/v1/agent/report", self.creds[node], body)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path_factory.mktemp("fuzz"))
    yield fleet
    fleet.store.dispose()


def no_5xx(resp: Any, what: str) -> None:
    assert resp.status_code < 500, f"{what}: {resp.status_code} {resp.get_data()[:300]!r}"
    if resp.status_code >= 400:
        error = resp.get_json()["error"]
        assert error["message"] and len(json.dumps(error)) < 20_000


@given(reports=st.lists(bad_reports(), min_size=1, max_size=5))
@FUZZ
def test_bad_reports_never_stop_placement_on_the_other_nodes(fleet: Fleet,
                                                             reports: list[bytes]) -> None:
    for body in reports:
        no_5xx(fleet.report("bad", body), f"report {body[:200]!r}")
    fleet.report("good", raw_json({"node": "good", "address": "127.0.0.1", "devices": [CPU],
                                   "engines": ["llama.cpp"]}))
    fleet.post("/api/v1/catalog", ADMIN, b"models: [{name: probe, source: /m/p.gguf, "
               b"engine: llama.cpp, profile: {class: cpu, memory_gb: 1}}]", method="PUT")
    assert fleet.reconciler.run_cycle()
    replicas = fleet.client.get("/api/v1/replicas",
                                headers={"Authorization": f"Bearer {ADMIN}"}).get_json()
    assert any(r["model"] == "probe" for r in replicas["replicas"])
    for path in ("/api/v1/status", "/api/v1/nodes", "/api/v1/plan", "/api/v1/routes"):
        no_5xx(fleet.client.get(path, headers={"Authorization": f"Bearer {ADMIN}"}), path)
    fleet.post("/api/v1/models/probe", ADMIN, b"", method="DELETE")


@given(body=JSON.map(raw_json) | st.binary(max_size=200))
@FUZZ
def test_join_idle_activate_and_keys_answer_4xx_to_anything(fleet: Fleet, body: bytes) -> None:
    for path, token in (("/api/v1/agent/join", JOIN), ("/api/v1/idle", ROUTER),
                        ("/api/v1/activate", ROUTER), ("/api/v1/unreachable", ROUTER),
                        ("/api/v1/keys", ADMIN)):
        resp = fleet.post(path, token, body)
        no_5xx(resp, f"{path} {body[:200]!r}")
        if resp.status_code < 300 and path == "/api/v1/keys":
            name = resp.get_json()["name"]
            fleet.post(f"/api/v1/keys/{name}", ADMIN, b"", method="DELETE")


@given(text=st.text(max_size=400) | JSON.map(lambda v: json.dumps({"models": [v]}))
       | st.sampled_from(["models: [&a {name: x}, *a, *a]",
                          "a: &a [1,1,1,1]\nb: &b [*a,*a,*a,*a]\nmodels: [*b, *b]"]))
@FUZZ
def test_any_catalog_text_is_applied_or_refused_with_a_bounded_message(fleet: Fleet,
                                                                       text: str) -> None:
    resp = fleet.post("/api/v1/catalog", ADMIN, text.encode(), method="PUT")
    no_5xx(resp, f"catalog {text[:200]!r}")
