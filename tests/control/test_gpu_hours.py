"""GPU-hours (issue 29): the reconciler counts the device-time each model's replicas hold,
on its own clock, into the store (SQLite and PostgreSQL); GET /api/v1/usage/gpu-hours
answers it per model, per key (shared by each key's tokens, hour by hour) and priced.
The counting rules themselves are pure and tested without a store."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw_runtime.control import gpu_hours
from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.control.reconcile import Reconciler
from llmgw_runtime.devices.fake_nvml import FakeNvml, h100_card, t4_card
from llmgw_runtime.devices.nvml import NvmlSource
from llmgw_runtime.security import hash_token
from llmgw_runtime.store import Store, devicetime, repo

from .conftest import ADMIN, CPU, JOIN, ROUTER, Api

H = 3600.0
T0 = 1_800_000_000.0            # an hour's start (500,000 hours after the epoch)
CATALOG = """models:
  - {name: chat, source: file:///m/chat.gguf, engine: vllm, profile: {class: h100-80g}}
"""
BOTH = CATALOG + """\
  - {name: embed, source: file:///m/embed.gguf, engine: vllm, profile: {class: t4-16g}}
"""


# ---------------------------------------------------------------- the rules (pure)

def _node(name: str, devices: list[dict[str, Any]], last_report: float = T0) -> Any:
    return SimpleNamespace(name=name, devices=json.dumps(devices), last_report=last_report)


def _replica(rid: str, model: str, node: str, devices: list[int],
             state: str = "ready") -> Any:
    return SimpleNamespace(id=rid, model=model, node=node, devices=json.dumps(devices),
                           state=state)


def _gpus(klass: str, count: int) -> list[dict[str, Any]]:
    return [{"id": i, "class": klass} for i in range(count)]


def test_every_device_held_counts_a_shared_one_split_a_silent_node_none() -> None:
    nodes = [_node("g", _gpus("h100-80g", 4)), _node("c", [CPU]),
             _node("w", _gpus("h100-80g", 2)),
             _node("gone", _gpus("h100-80g", 1), last_report=T0 - 31)]
    replicas = [_replica("r1", "big", "g", [0, 1]),                 # two GPUs: two
                _replica("r2", "big", "g", [2], state="starting"),
                _replica("r3", "big", "g", [3], state="failed"),      # holds nothing
                _replica("r4", "tiny", "c", [0]), _replica("r5", "tiny", "c", [0]),
                _replica("r6", "edge", "c", [0], state="pending"),    # three share the CPU
                _replica("r7", "wide", "g", [9], state="fetching"),   # not reported: unknown
                _replica("r8", "lost", "gone", [0])]
    parts = {"r1": [SimpleNamespace(node="w", devices="[0, 1]")]}     # a multi-node replica
    assert gpu_hours.held(replicas, parts, nodes, T0, node_timeout_s=30) == {
        ("big", "h100-80g"): 5, ("tiny", "cpu"): pytest.approx(2 / 3),
        ("edge", "cpu"): pytest.approx(1 / 3), ("wide", "(unknown)"): 1}


def test_the_clock_counts_what_is_held_now_whatever_moved_between_its_passes() -> None:
    """The clock makes what is held again only when what it reads moved (a steady fleet
    of 10,000 nodes spared 20-35 ms a pass): after every random change the held devices
    are what a fresh count gives."""
    import random

    rnd = random.Random(7)
    clock = gpu_hours.DeviceClock(ControlConfig(node_timeout_s=30))
    nodes = {n: _node(n, _gpus(rnd.choice(["h100-80g", "t4-16g"]), 2)) for n in "abcd"}
    replicas = {f"r{i}": _replica(f"r{i}", rnd.choice(["x", "y"]), rnd.choice("abcd"),
                                  [rnd.randrange(2)]) for i in range(6)}
    parts: dict[str, list[Any]] = {}
    now, recounts = T0, 0
    for step in range(300):
        now += 0.1                # the clock writes once a minute: not in this test
        change = rnd.randrange(8)
        rid, name = rnd.choice(sorted(replicas)), rnd.choice("abcd")
        node = nodes[name]
        if change == 0:           # a state, holding or not
            replicas[rid] = SimpleNamespace(**{**vars(replicas[rid]), "state": rnd.choice(
                ["ready", "starting", "unreachable", "failed", "stopping"])})
        elif change == 1:         # a node that stops or starts reporting
            node.last_report = now - rnd.choice([0, 31])
        elif change == 2:         # new readings: the same classes, another text
            devices = json.loads(node.devices)
            devices[0]["temperature_c"] = step
            node.devices = json.dumps(devices)
        elif change == 3:         # the node's classes moved (MIG made, a card swapped)
            node.devices = json.dumps(_gpus(rnd.choice(["h100-80g", "a100-80g"]), 2))
        elif change == 4:         # a worker part comes or goes
            if rid in parts:
                del parts[rid]
            else:
                parts[rid] = [SimpleNamespace(node=name, devices="[1]")]
        elif change == 5:         # a replica moves to other devices, or to another model
            replicas[rid] = SimpleNamespace(**{**vars(replicas[rid]), "devices": "[0, 1]",
                                               "model": rnd.choice(["x", "y", "z"])})
        else:                     # reports with nothing new
            node.last_report = now
        rows = list(replicas.values())
        before = clock.held
        clock.observe(None, now, list(nodes.values()), (rows, parts))
        assert clock.held == gpu_hours.held(rows, parts, nodes.values(), now, 30), step
        recounts += clock.held is not before
    assert 0 < recounts < 300            # it did keep its count across some passes


def test_an_interval_is_split_at_the_hour_and_a_gap_counted_up_to_the_bound() -> None:
    assert gpu_hours.split(T0 - 100, T0 + 50, {("m", "h100-80g"): 2, ("x", "cpu"): 0}) == {
        (T0 - H, "m", "h100-80g"): 200.0, (T0, "m", "h100-80g"): 100.0}
    assert gpu_hours.gap_bound_s(ControlConfig()) == 4.0          # two report intervals
    assert gpu_hours.counted(T0, T0 + 1, 4.0) == (T0, T0 + 1)
    assert gpu_hours.counted(T0, T0 + 600, 4.0) == (T0, T0 + 4)   # the leader was away
    assert gpu_hours.counted(None, T0, 4.0) is None               # its first pass
    assert gpu_hours.counted(T0, T0 - 1, 4.0) is None             # a clock gone back


def test_costs_are_parsed_and_a_bad_setting_says_what_to_write() -> None:
    assert gpu_hours.parse_costs(" h100-80g=2.5, cpu=0 ") == {"h100-80g": 2.5, "cpu": 0.0}
    assert gpu_hours.parse_costs("") == {}
    for text, says in (("h100-80g", "is not CLASS=PRICE; write e.g. h100-80g=2.5"),
                       ("=2", "is not CLASS=PRICE"),
                       ("cpu=cheap", "the price must be a number from 0"),
                       ("cpu=-1", "the price must be a number from 0"),
                       ("cpu=nan", "the price must be a number from 0"),
                       ("cpu=1,cpu=2", "class 'cpu' is priced twice")):
        with pytest.raises(ValueError) as caught:
            gpu_hours.parse_costs(text)
        assert says in str(caught.value), text
    [problem] = ControlConfig(cost_per_device_hour="h100=two").validate()
    assert problem.startswith("LLMGW_COST_PER_DEVICE_HOUR='h100=two': 'h100=two': the price")


# ---------------------------------------------------------------- the reconciler's clock

def _devices(card: Any) -> list[dict[str, Any]]:
    """What an agent reports of ``card``, found by the fake NVML (its device class too)."""
    return list(NvmlSource(FakeNvml([card])).discover().to_dicts())


@pytest.fixture
def priced(store: Store, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A control service whose store clock (the reconciler's, the API's) is ``clock[0]``,
    with H100 hours priced; passes and reports far apart (so few are needed)."""
    config = ControlConfig(state_dir=tmp_path, admin_token=ADMIN, join_token=JOIN,
                           router_token=ROUTER, report_interval_s=600, node_timeout_s=3600,
                           replace_after_s=3600, start_timeout_s=7200,
                           cost_per_device_hour="h100-80g=2.5,cpu=0")
    bootstrap(store, config)
    api = Api(create_app(config, store_=store).test_client(), store, config)
    clock = [T0 - 1800]
    monkeypatch.setattr(store, "now", lambda conn: clock[0])
    monkeypatch.setattr(store, "clock", lambda conn: clock[0])
    return api, clock


def _pass(api: Api, clock: list[float], at: float, nodes: dict[str, str]) -> None:
    """At ``at``: every node reports (its replicas ready), then the reconciler passes."""
    clock[0] = at
    for node, cred in nodes.items():
        answer = api.report(cred, node, devices=_devices(NODES[node]), engines=["vllm"])
        api.report(cred, node, devices=_devices(NODES[node]), engines=["vllm"],
                   replicas=[{"id": a["replica_id"], "state": "ready", "port": 41000, "pid": 1}
                             for a in answer.json["assignments"]])
    assert api.reconciler.run_cycle()


NODES = {"n1": h100_card(), "n2": t4_card()}


def _hours(api: Api, query: str) -> dict[str, Any]:
    resp = api.call("GET", "/api/v1/usage/gpu-hours" + query)
    assert resp.status_code == 200, resp.json
    return dict(resp.json)


def test_the_reconciler_counts_held_hours_and_a_key_gets_its_share_of_tokens(
        priced: Any) -> None:
    api, clock = priced
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    creds = {"n1": api.join("n1"), "n2": api.join("n2")}
    # chat is placed at T0-1800, embed (on the T4) at T0-900; passes every 900 s or less,
    # one across the hour at T0; both held until the last pass at T0+1800.
    _pass(api, clock, T0 - 1800, creds)
    clock[0] = T0 - 900
    assert api.call("PUT", "/api/v1/catalog", data=BOTH).status_code == 200
    for at in (T0 - 900, T0 - 300, T0 + 600, T0 + 1500, T0 + 1800):
        _pass(api, clock, at, creds)
        if at == T0 + 600:          # in the hour from T0, app uses 3/4 of chat's tokens
            app, ci = (hash_token(api.call("POST", "/api/v1/keys", json={"name": n})
                                  .json["key"]) for n in ("app", "ci"))
            assert api.call("POST", "/api/v1/usage", token=ROUTER, json={
                "reporter": "r-1", "seq": 1, "entries": [
                    {"key": app, "model": "chat", "requests": 3, "prompt_tokens": 200,
                     "completion_tokens": 100},
                    {"key": ci, "model": "chat", "requests": 1, "prompt_tokens": 100,
                     "completion_tokens": 0}]}).json == {"applied": True}
    with api.store.begin() as conn:
        stored = devicetime.read(conn, T0 - H, T0)
    assert [(t.bucket - T0, t.model, t.device_class, t.seconds) for t in stored] == [
        (-H, "chat", "h100-80g", 1800.0), (-H, "embed", "t4-16g", 900.0),
        (0.0, "chat", "h100-80g", 1800.0), (0.0, "embed", "t4-16g", 1800.0)]

    by_model = _hours(api, "?since=2h&by=model")
    assert (by_model["since"], by_model["until"], by_model["unattributed"]) == (
        T0 - 2 * H, T0 + 1800, [])
    assert by_model["rows"] == [
        {"model": "chat", "device_class": "h100-80g", "device_hours": 1.0, "cost": 2.5},
        {"model": "embed", "device_class": "t4-16g", "device_hours": 0.75, "cost": None}]
    # the hour before T0 had no tokens: all of it unattributed, as all of embed's
    by_key = _hours(api, "?since=2h&by=key")
    assert by_key["rows"] == [
        {"key": "app", "device_class": "h100-80g", "device_hours": 0.375, "cost": 0.9375},
        {"key": "ci", "device_class": "h100-80g", "device_hours": 0.125, "cost": 0.3125}]
    assert by_key["unattributed"] == [
        {"model": "chat", "device_class": "h100-80g", "device_hours": 0.5, "cost": 1.25},
        {"model": "embed", "device_class": "t4-16g", "device_hours": 0.75, "cost": None}]
    assert _hours(api, "?since=2h")["rows"][0] == {           # by key,model by default
        "key": "app", "model": "chat", "device_class": "h100-80g", "device_hours": 0.375,
        "cost": 0.9375}
    # the last hour only: the hour T0 began
    assert [r["device_hours"] for r in _hours(api, "?since=30m&by=model")["rows"]] == [
        0.5, 0.5]
    bad = api.call("GET", "/api/v1/usage/gpu-hours?by=class")
    assert bad.status_code == 400 and "use key, model or key,model" in bad.json["error"]["message"]
    assert api.call("GET", "/api/v1/usage/gpu-hours", token=ROUTER).status_code == 403


def test_counted_time_is_written_at_leadership_loss_and_at_stop_once(priced: Any) -> None:
    api, clock = priced
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    creds = {"n1": api.join("n1")}
    _pass(api, clock, T0 + 10, creds)
    _pass(api, clock, T0 + 40, creds)        # 30 s counted, not written yet (a minute)

    def written() -> list[tuple[str, float]]:
        with api.store.begin() as conn:
            return [(t.model, t.seconds) for t in devicetime.read(conn, T0, T0)]

    assert written() == []
    clock[0] = T0 + 60                       # its lease ran out: another takes over
    other = Reconciler(api.store, api.config, holder="other")
    assert other.run_cycle() and not api.reconciler.run_cycle()
    assert written() == [("chat", 30.0)]     # the loser wrote what it counted
    clock[0] = T0 + 62
    assert other.run_cycle()
    other.release()                          # stopping: its 2 s, none counted twice
    assert written() == [("chat", 32.0)]


def test_a_store_that_fails_keeps_the_count_for_the_next_try(tmp_path: Any) -> None:
    clock = gpu_hours.DeviceClock(ControlConfig())
    clock.pending = {(T0, "chat", "h100-80g"): 5.0}
    broken = Store(f"sqlite:///{tmp_path}/no/such/dir/llmgw.db")
    try:
        clock.flush(broken)
    finally:
        broken.dispose()
    assert clock.pending == {(T0, "chat", "h100-80g"): 5.0} and clock.unwritten


def test_after_each_pass_the_clock_holds_what_the_store_holds(priced: Any) -> None:
    """The clock counts with the replicas as the pass leaves them, made from what it read
    and decided (not read again): after passes that start replicas, delete them (their
    agent no longer runs them) and stop one (its model left the catalog), what it holds is
    what a count of the store's rows gives."""
    api, clock = priced
    assert api.call("PUT", "/api/v1/catalog", data=BOTH).status_code == 200
    creds = {"n1": api.join("n1"), "n2": api.join("n2")}
    seen = []
    for step, at in enumerate(range(int(T0 - 1800), int(T0 - 1700), 10)):
        if step == 3:     # embed leaves the catalog while pending: its replica stops
            assert api.call("PUT", "/api/v1/catalog?prune=true",
                            data=CATALOG).status_code == 200
            clock[0] = at
            assert api.reconciler.run_cycle()
        else:             # replicas the agents no longer run go, new ones are placed
            _pass(api, clock, at, creds)
        with api.store.begin() as conn:
            stored = gpu_hours.held(repo.list_replicas(conn), repo.parts_by_replica(conn),
                                    repo.list_nodes(conn), at, api.config.node_timeout_s)
            states = sorted((r.model, r.state) for r in repo.list_replicas(conn))
        assert api.reconciler.device_clock.held == stored, (step, states)
        seen.append((states, stored))
    assert seen[0] == ([("chat", "pending"), ("embed", "pending")],
                       {("chat", "h100-80g"): 1.0, ("embed", "t4-16g"): 1.0})
    assert any(("embed", "stopping") in states and ("embed", "t4-16g") not in held
               for states, held in seen)
