"""The leader's incremental fleet view (control/incremental.py) never diverges from a full
read: randomised operations through the real API, fleet and store functions (catalog
applies, joins, reports and heartbeats, router posts, activations, drains, cordons,
credential resets, deletions), a reconcile pass after each, and before every pass the view
compared with ``fleet.read`` in the same transaction. On SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from llmgw_runtime.api.catalog import ModelSpec, Profile
from llmgw_runtime.api.router import IdleMap, ModelCapacity, Unreachable
from llmgw_runtime.control import drain_ops, fleet, snapshot, viewrows
from llmgw_runtime.control.decide import Fleet, Settings, decide
from llmgw_runtime.control.incremental import View
from llmgw_runtime.control.reconcile import PassTimes
from llmgw_runtime.errors import LlmgwError
from llmgw_runtime.store import Store, repo
from llmgw_runtime.store.db import fleet_changed
from llmgw_runtime.store.schema import nodes

from .conftest import CPU, Api

SETTINGS = Settings()
WALKS: list[int] = []       # each pass's walks of every node (0: the changed nodes only)
MADE: list[tuple[int, int]] = []    # each pass's replica views made, of how many
NODES = [f"n{i}" for i in range(6)]
MODELS = [f"m{i}" for i in range(5)]


def rows(table: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k: dict(v._mapping) if hasattr(v, "_mapping") else
            dict(v) if isinstance(v, dict) else dict(vars(v))
            for k, v in table.items()}


def differ(got: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    """What differs of two tables (rows by key), column by column."""
    a, b = rows(got), rows(want)
    return {k: {c: (a.get(k, {}).get(c), b.get(k, {}).get(c))
                for c in set(a.get(k, {})) | set(b.get(k, {}))
                if a.get(k, {}).get(c) != b.get(k, {}).get(c)}
            for k in set(a) | set(b) if a.get(k) != b.get(k)}


def same(got: Fleet, want: Fleet, heard: float | None = None) -> int:
    """The view's fleet is the full read's: the same rows, in the same order; with
    ``heard`` (a view's ``now - heard_s / 2``), a node's report time may be an earlier one
    than the store's, no earlier than ``heard``. Returns how many were."""
    assert list(got.models) == list(want.models)
    assert not differ(got.models, want.models)
    assert list(got.nodes) == list(want.nodes)
    stored = {name: {k: v for k, v in row._mapping.items() if k != "credential_hash"}
              for name, row in want.nodes.items()}
    earlier = {name: (got.nodes[name].last_report, row["last_report"])
               for name, row in stored.items()
               if got.nodes[name].last_report != row["last_report"]}
    assert all(heard is not None and held is not None and t is not None
               and heard <= held <= t for held, t in earlier.values()), earlier
    assert not differ(got.nodes, {name: {**row, "last_report": got.nodes[name].last_report}
                                  if name in earlier else row
                                  for name, row in stored.items()})
    assert not differ({r.id: r for r in got.replicas}, {r.id: r for r in want.replicas})
    assert [(r.model, r.started) for r in got.replicas] == \
        [(r.model, r.started) for r in want.replicas]
    assert {k: [dict(vars(p)) for p in v] for k, v in got.parts.items()} == \
        {k: [dict(p._mapping) for p in v] for k, v in want.parts.items()}
    return len(earlier)


def reconcile(store: Store, view: View) -> int:
    """One pass as the leader runs it (``fleet.reconcile``), the view checked against a
    full read first; how many nodes' report times it held earlier than the store's."""
    with store.begin() as conn:
        now = store.now(conn)
        got = view.refresh(conn, now)
        want = fleet.read(conn)
        earlier = same(got, want, None if view.heard_s is None else now - view.heard_s / 2)
        walks, made = snapshot.NODES.walks, snapshot.REPLICAS.made
        changes = decide(got, now, SETTINGS)
        fleet.write(conn, changes, now)
        view.wrote(changes.node_problems)
    # the node views the pass placed with, most of them kept from the pass before (only
    # the nodes the view changed looked up again: ``Fleet.nodes_since``), are a fresh
    # walk's of the same rows
    assert snapshot.NODES.last == snapshot.NodeMemo().views(list(got.nodes.values()))
    WALKS.append(snapshot.NODES.walks - walks)
    # the replica views it placed with, most of them taken by the record's identity, are
    # what a fresh memo makes of the same rows (no record was changed in place)
    inputs, views = snapshot.REPLICAS.last
    assert views == snapshot.ReplicaMemo().views(*inputs)
    MADE.append((snapshot.REPLICAS.made - made, len(views)))
    # the planner's node views, remembered across passes (records patched in place
    # included), are what a first sight of the full read's rows makes (report times
    # aside when the view holds earlier ones)
    assert [snapshot.NODES.view(row).reported(None) for row in got.nodes.values()] == \
        [snapshot.NodeMemo().view(row).reported(None) for row in want.nodes.values()]
    assert [snapshot.NODES.view(row) for row in got.nodes.values()] == \
        [snapshot.NodeMemo().view(row) for row in got.nodes.values()]
    return earlier


class Ops:
    """Random operations on a small fleet of CPU nodes."""

    def __init__(self, api: Api, rnd: random.Random) -> None:
        self.api, self.store, self.rnd = api, api.store, rnd
        self.creds: dict[str, str] = {}

    def tx(self, fn: Callable[[Any, float], Any]) -> None:
        try:
            with self.store.begin() as conn:
                fn(conn, self.store.now(conn))
        except LlmgwError:
            pass                                    # refused as a user would be: fine

    def apply(self) -> None:
        names = self.rnd.sample(MODELS, self.rnd.randint(1, len(MODELS)))
        specs = [ModelSpec(name=n, source=f"/m/{n}.gguf", engine="llama.cpp",
                           profile=Profile.model_validate({"class": "cpu"}),
                           replicas=self.rnd.randint(0, 2), on_demand=self.rnd.random() < 0.3)
                 for n in names]
        prune = self.rnd.random() < 0.2
        self.tx(lambda conn, now: fleet.apply_catalog(conn, specs, now, prune))

    def join(self) -> None:
        node = self.rnd.choice(NODES)
        if node not in self.creds:
            self.creds[node] = self.api.join(node)

    def devices(self) -> list[dict[str, Any]]:
        return [{**CPU, "memory_used_mb": self.rnd.choice([1000, 2000, 3000])}]

    def report(self) -> None:
        if not self.creds:
            return self.join()
        node = self.rnd.choice(sorted(self.creds))
        with self.store.begin() as conn:
            ids = [r.id for r in repo.list_replicas(conn, node=node)]
        states = ["ready", "ready", "starting", "failed"]
        reported = [{"id": rid, "state": self.rnd.choice(states), "port": 41000, "pid": 7}
                    for rid in ids if self.rnd.random() < 0.8]
        # now and then its agent's last report: the node is not heard from until the next
        answer = self.api.report(self.creds[node], node, replicas=reported,
                                 devices=self.devices(), stopping=self.rnd.random() < 0.15)
        if answer.status_code == 401:               # its credential was reset
            del self.creds[node]

    def heartbeat(self) -> None:
        """A steady agent's refreshed report time and device readings, through the
        control service's batch writer (control/beats.py ``Heartbeats``)."""
        if not self.creds:
            return
        node = self.rnd.choice(sorted(self.creds))
        with self.store.begin() as conn:
            now = self.store.now(conn)
        writer = self.api.client.application.extensions["llmgw.heartbeats"]
        writer.put(node, now, json.dumps(self.devices()))

    def replica(self) -> str | None:
        with self.store.begin() as conn:
            ids = [r.id for r in repo.list_replicas(conn)]
        return self.rnd.choice(ids) if ids else None

    def router_post(self) -> None:
        rid = self.replica()
        model = self.rnd.choice(MODELS)
        body = IdleMap(replicas={rid: self.rnd.uniform(0, 100)} if rid else {},
                       capacity={model: ModelCapacity(
                           waiting=self.rnd.randint(0, 3), in_flight=1, slots=1,
                           rejected=0, at_capacity=self.rnd.random() < 0.5)},
                       router="r1", worker="w1",
                       in_flight={rid: self.rnd.randint(0, 2)} if rid else {})
        self.tx(lambda conn, now: fleet.record_idle(conn, body, now))

    def unreachable(self) -> None:
        rid = self.replica()
        if rid:
            self.tx(lambda conn, now: fleet.mark_unreachable(
                conn, Unreachable(replica_id=rid, reason="refused"), now))

    def activate(self) -> None:
        name = self.rnd.choice(MODELS)
        self.tx(lambda conn, now: fleet.activate(conn, name, now, SETTINGS))

    def unpark(self) -> None:
        name = self.rnd.choice(MODELS)
        self.tx(lambda conn, now: fleet.unpark(conn, name, now))

    def delete_model(self) -> None:
        name = self.rnd.choice(MODELS)
        self.tx(lambda conn, now: fleet.delete_model(conn, name, now))

    def drain(self) -> None:
        node = self.rnd.choice(NODES)
        if self.rnd.random() < 0.5:
            self.tx(lambda conn, now: drain_ops.drain_node(
                conn, node, now, SETTINGS, force=True, by="test"))
        else:
            on = self.rnd.random() < 0.5
            self.tx(lambda conn, now: drain_ops.cordon(conn, node, now, "test", on))

    def reset(self) -> None:
        node = self.rnd.choice(NODES)
        self.tx(lambda conn, now: fleet.reset_node(conn, node, now, "test"))
        self.creds.pop(node, None)

    def delete_node(self) -> None:
        node = self.rnd.choice(NODES)
        self.tx(lambda conn, now: fleet.delete_node(conn, node, now, SETTINGS, force=True,
                                                    by="test"))
        self.creds.pop(node, None)

    def pick(self) -> Callable[[], Any]:
        weighted = [(self.apply, 3), (self.join, 3), (self.report, 8), (self.heartbeat, 6),
                    (self.router_post, 4), (self.unreachable, 1), (self.activate, 2),
                    (self.unpark, 1), (self.delete_model, 1), (self.drain, 2),
                    (self.reset, 1), (self.delete_node, 1)]
        fns, weights = zip(*weighted, strict=True)
        return self.rnd.choices(fns, weights)[0]


@pytest.mark.parametrize("heard_s", [None, 0.4], ids=["every report", "heard_s"])
def test_the_incremental_view_never_diverges_from_a_full_read(
        api: Api, heard_s: float | None) -> None:
    """With ``heard_s`` (the reconciler's view, here 0.4 s so that a report time held
    ages within the test), a node's report time may be an earlier one than the store's,
    within ``heard_s / 2`` of the pass: each such time says what the store's does."""
    rnd = random.Random(30)
    view = View(full_every=10**6, heard_s=heard_s)   # no periodic full read: the log
    WALKS.clear()
    MADE.clear()
    ops = Ops(api, rnd)
    for node in NODES[:3]:
        ops.creds[node] = api.join(node)
    reconcile(api.store, view)
    earlier = []
    for _ in range(120):
        for _ in range(rnd.randint(1, 3)):
            ops.pick()()
        earlier.append(reconcile(api.store, view))
    assert view.fulls == 1, "every pass after the first read only what changed"
    # the first pass walks every node, and so does one after a node joined or left
    assert WALKS[0] == 1 and 20 < WALKS.count(0) < len(WALKS), WALKS
    # most replica views are the last pass's, taken by the record's identity
    made, views = map(sum, zip(*MADE, strict=True))
    assert made < views / 2, MADE
    if heard_s is not None:     # some times were held earlier than the store's
        assert any(earlier), earlier
    with api.store.begin() as conn:
        placed = len(repo.list_replicas(conn))
    assert placed, "the operations left replicas to compare"


def test_what_no_log_entry_names_is_read_again_within_full_every_passes(
        store: Store) -> None:
    """The rolling full check: a column changed behind the change log's back (here by
    hand) reaches the view within ``full_every`` passes, without a full read."""
    with store.begin() as conn:
        now = store.now(conn)
        for i in range(8):
            repo.set_node_credential(conn, f"n{i}", f"{i}" * 64, now)
    view = View(full_every=4)
    with store.begin() as conn:
        view.refresh(conn)
    with store.begin() as conn:
        conn.execute(nodes.update().values(engines='["vllm"]'))
    seen = []
    for _ in range(4):
        with store.begin() as conn:
            fleet_ = view.refresh(conn)
        seen.append(sum(n.engines == '["vllm"]' for n in fleet_.nodes.values()))
    assert seen[-1] == 8 and seen[0] < 8, seen
    assert view.fulls == 1
    view.reset()
    with store.begin() as conn:
        view.refresh(conn)
    assert view.last_full and view.fulls == 2


def test_a_node_never_heard_from_is_read_by_its_log_entries_not_every_pass(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reconciler's view reads no report time of a node that joined and never
    reported, nor of one whose agent said it stopped: only a logged write gives either one
    (its next report), and then the view holds it. A fleet that joins before its agents
    start cost a read of every such node each pass."""
    creds = {n: api.join(n) for n in ("n1", "n2")}
    view = View(full_every=10**6, heard_s=30.0)     # no rolling check: the log alone
    asked: list[set[str]] = []
    reports_of = viewrows.reports_of
    monkeypatch.setattr(viewrows, "reports_of",
                        lambda conn, names: asked.append(set(names)) or reports_of(conn, names))
    reported: set[str] = set()

    def refreshed() -> set[str]:
        asked.clear()
        with api.store.begin() as conn:
            held = view.refresh(conn, api.store.now(conn))
        assert {n: r.last_report is None for n, r in held.nodes.items()} == \
            {"n1": "n1" not in reported, "n2": "n2" not in reported}
        return set().union(*asked)

    refreshed()
    assert refreshed() == set() and refreshed() == set(), "none was heard from: none is read"
    assert api.report(creds["n1"], "n1").status_code == 200
    reported.add("n1")
    refreshed()                                        # its report's log entry: read whole
    assert refreshed() == set(), "its report time is within heard_s / 2"
    assert api.report(creds["n1"], "n1", stopping=True).status_code == 200
    reported.discard("n1")
    refreshed()
    assert refreshed() == set(), "a stopped agent's node is read by its next report's entry"
    assert api.report(creds["n1"], "n1").status_code == 200
    reported.add("n1")
    refreshed()


def test_the_report_times_kept_to_pop_do_not_grow_with_the_passes(api: Api) -> None:
    """The reconciler's view keeps a heap of report times to pop the nodes due; each read
    adds entries, and popping them keeps it about one a node however many passes run. A
    view without ``heard_s`` (the status summary's, in every web worker for months) pops
    none, so it keeps none."""
    creds = {n: api.join(n) for n in ("n1", "n2", "n3")}
    # every row read whole each pass; a time held is due 10 ms on, and the passes are
    # 50 ms apart: each pass pops what the last one pushed
    leader = View(full_every=1, heard_s=0.02)
    summary = View(full_every=1, reports_apart=True)
    for _ in range(12):
        time.sleep(0.05)
        for name, cred in creds.items():
            assert api.report(cred, name).status_code == 200
        with api.store.begin() as conn:
            leader.refresh(conn, api.store.now(conn))
            summary.refresh(conn)
    assert 0 < len(leader._times) <= 2 * len(creds), leader._times
    assert summary._times == []


def test_the_passes_are_logged_every_10s_in_the_line_the_benchmarks_read(
        caplog: pytest.LogCaptureFixture) -> None:
    times = PassTimes(every_s=0.0)
    with caplog.at_level(logging.INFO, logger="llmgw_runtime.control.reconcile"):
        times.add(0.0123, True, 0.0045)
    assert caplog.messages == ["reconcile passes last 10s: n=1 full=1 p50_ms=12.3 "
                               "p99_ms=12.3 max_ms=12.3 cpu_p50_ms=4.5 cpu_p99_ms=4.5"]


def test_a_pass_knows_the_plan_problem_it_wrote_without_reading_the_node_again(
        api: Api) -> None:
    """The reconciler's view reads a heard node's report columns again only every
    ``heard_s / 2``: the problem its own pass wrote (a node whose stored report the planner
    cannot use) is set in its record, so the next passes neither write nor tell it again."""
    cred = api.join("n1")
    assert api.report(cred, "n1", devices=[CPU]).status_code == 200
    assert api.reconciler.run_cycle()
    with api.store.begin() as conn:       # a report stored before reports were strict
        conn.execute(nodes.update().where(nodes.c.name == "n1")
                     .values(devices='[{"id": "zero", "class": "cpu"}]'))
        fleet_changed(conn, nodes=["n1"])
    for _ in range(3):
        assert api.reconciler.run_cycle()
    with api.store.begin() as conn:
        told = [e for e in repo.list_events(conn) if "left out of placement" in e["message"]]
        problem = repo.get_node(conn, "n1").plan_problem
    assert len(told) == 1 and problem and "its stored report cannot be used" in problem
