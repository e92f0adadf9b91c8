"""The fleet summary (``status.summary.build``) from one read of the store, split in two so
each half can be measured: ``read`` turns the rows into the dicts the views show (the
replicas read once, for the models' states and the summary both), ``build`` derives the
summary from them. ``summary`` is the two together: what the status endpoint and the
console call (``fleet.summary`` answers the same, reading the replicas twice and decoding
every node's JSON on every call).

The read is incremental, as the reconciler's (control/incremental.py): each process keeps
the fleet it last read for a summary, per store (``HELD``), and reads again only what the
store's change log names since, and the columns written without a log entry, narrowly. At
10,000 nodes that is a node's report time and problem, not its 3 KiB of devices, and the
views of rows that did not change are kept (``Decoded``)."""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from sqlalchemy.engine import Connection, Engine

from ..coop import sliced
from ..gckeeper import paused
from ..status import summary as status_summary
from ..store import repo
from . import autoscale, drain
from .decide import Settings
from .fleet import replica_view
from .incremental import View
from .states import failing, model_state


class Decoded:
    """Nodes' JSON columns decoded once per text, kept between requests: the devices of a
    node by its name (decoded again only when its text changed), the engines, weights and
    hardware by text (most nodes of a large fleet report the same); model and replica rows
    as dicts by their names and values, nodes by the kept fleet's records (``nodes``). What
    it returns is shared between requests: callers read it, never change it. Bounded: each
    map starts over when it holds more than ``limit`` entries."""

    def __init__(self, limit: int = 100_000) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._devices: dict[str, tuple[str, Any]] = {}
        self._texts: dict[str, Any] = {}
        # name (a replica's id) -> (the row's values, its view)
        self._models: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        # name -> (a view record, its view, its facts)
        self._records: dict[str, tuple[Any, dict[str, Any], status_summary.Facts]] = {}
        self._replicas: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}

    def _keep(self, kept: dict[Any, Any], key: Any, value: Any) -> None:
        """Keep ``value`` under ``key`` in one of the maps, which starts over when full."""
        with self._lock:
            if len(kept) >= self.limit:
                kept.clear()
            kept[key] = value

    def devices(self, name: str, text: str) -> Any:
        """A node's devices decoded."""
        seen = self._devices.get(name)
        if seen is not None and seen[0] == text:
            return seen[1]
        value = json.loads(text)
        self._keep(self._devices, name, (text, value))
        return value

    def text(self, text: str) -> Any:
        try:
            return self._texts[text]
        except KeyError:
            value = json.loads(text)
        self._keep(self._texts, text, value)
        return value

    # Each view is kept by its row's name with the values it was made from, and used while
    # the row's values are equal: comparing a row's long texts (a node's devices, a
    # model's spec) costs a memcmp, where keying a map by them hashed every text of every
    # row at every read (a fifth of a 10,000-node read).

    def model(self, row: Any) -> dict[str, Any]:
        """``repo.model_to_dict(row)`` (a copy: callers add to it), kept while the row's
        values stay: a model row changes rarely, and its spec is validated once."""
        values = _values(row)
        found = self._models.get(row.name)
        if found is None or found[0] != values:
            found = (values, repo.model_to_dict(row))
            self._keep(self._models, row.name, found)
        return dict(found[1])

    def replica(self, row: Any, parts: list[Any] | None, now: float) -> dict[str, Any]:
        """``fleet.replica_view(row, parts, now)`` (a copy), kept while the row's and its
        parts' values stay and it does not drain (a drain's view moves with ``now``)."""
        if drain.is_draining(row):
            return replica_view(row, parts, now)
        values = (_values(row), *(_values(p) for p in parts or ()))
        found = self._replicas.get(row.id)
        if found is None or found[0] != values:
            found = (values, replica_view(row, parts, now))
            self._keep(self._replicas, row.id, found)
        return dict(found[1])

    def nodes(self, records: list[Any], reports: dict[str, tuple[Any, ...]]
              ) -> tuple[list[dict[str, Any]], dict[str, status_summary.Facts]]:
        """``node`` of each record of a view that keeps its nodes' reports apart
        (``incremental.View(reports_apart=True)``), with its report time and problem from
        ``reports``; and their ``status.summary.node_facts``. A record stays the same
        object while its node's row does, so its view and facts are kept while it is."""
        out = []
        facts = {}
        for row in sliced(records):     # a web worker's loop keeps serving (coop.py)
            name = row.name
            found = self._records.get(name)
            if found is None or found[0] is not row:
                view = self._node(row)
                found = (row, view, status_summary.node_facts(view))
                self._keep(self._records, name, found)
            _, last_report, plan_problem = reports[name]
            out.append({**found[1], "last_report": last_report,
                        "problem": row.problem or plan_problem})
            facts[name] = found[2]
        return out, facts

    def _node(self, row: Any) -> dict[str, Any]:
        return {"name": row.name, "fabric": row.fabric, "address": row.address,
                "last_report": row.last_report, "agent_version": row.agent_version,
                "devices": self.devices(row.name, row.devices),
                "engines": self.text(row.engines), "weights": self.text(row.weights),
                "hardware": self.text(row.hardware),
                "problem": row.problem or row.plan_problem,
                "cordoned": bool(getattr(row, "cordoned", 0)),
                "draining": drain.draining_node(row)}


def _values(row: Any) -> Any:
    """What a row holds, to compare with what it held: a view record's attributes (the
    same dict while the record is), a store row's values."""
    held = getattr(row, "__dict__", None)
    return tuple(row) if held is None else held


DECODED = Decoded()


# what Held.fleet answers: models (not deleted), nodes, replicas, their parts, the reports
HeldRows = tuple[list[Any], list[Any], list[Any], dict[str, list[Any]], dict[str, tuple[Any, ...]]]


class Held:
    """The fleet as this process last read it for a summary (``incremental.View``), one per
    store. Requests take turns to bring it up to date; each gets lists of its own.

    The turn is a lock held across the store's round trips, so in a gevent web worker it
    must be gevent's: :func:`renew_after_patch` makes it again after the patch (made at
    import, in the server's master, it is an OS lock, and a greenlet waiting on it while
    another holds it would stop the worker's event loop for good)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: weakref.WeakKeyDictionary[Engine, View] = weakref.WeakKeyDictionary()

    def fleet(self, conn: Connection) -> HeldRows:
        """Models (not deleted), nodes, replicas and their parts as ``conn`` reads them,
        in ``repo.list_*``'s order; and the nodes' reports (``View.reports``: their own
        report times and problems are not kept up to date)."""
        with self._lock:
            view = self._views.get(conn.engine)
            if view is None:
                view = self._views[conn.engine] = View(reports_apart=True)
            try:
                fleet = view.refresh(conn)
            except BaseException:
                view.reset()            # part read: read all of it next time
                raise
            # copies: the next refresh changes the view's maps in place
            return ([m for m in fleet.models.values() if m.deleted_at is None],
                    list(fleet.nodes.values()), list(fleet.replicas), dict(fleet.parts),
                    view.reports)


HELD = Held()


def renew_after_patch() -> None:
    """Make ``HELD`` again in a process where gevent has just patched the standard library
    (control/worker.py): its lock must be one a greenlet waits on cooperatively."""
    HELD.__init__()  # type: ignore[misc]


@dataclass(frozen=True)
class Rows:
    """The fleet as the summary reads it, at the store's ``now``."""

    now: float
    models: list[dict[str, Any]]
    nodes: list[dict[str, Any]]
    replicas: list[dict[str, Any]]
    facts: dict[str, status_summary.Facts]      # node -> what its report alone says


def models_of(model_rows: list[Any], replica_rows: list[Any], now: float,
              backoff: tuple[float, float]) -> list[dict[str, Any]]:
    """Every model with its state and failing streak, as ``fleet.models_view`` with the
    reconciler's backoff, from rows already read."""
    by_model: dict[str, list[Any]] = {}
    for rep in replica_rows:
        by_model.setdefault(rep.model, []).append(rep)
    out = []
    for row in sliced(model_rows):
        item = DECODED.model(row)
        reps = by_model.get(row.name, [])
        state = model_state(row, reps, now)
        serving = [r for r in reps if not drain.is_draining(r)]
        item.update(state=state.state, reason=state.reason, ready=state.ready,
                    wanted=state.wanted, scaling=autoscale.view(row, serving, now),
                    failing=failing(row, reps, state, now, backoff))
        out.append(item)
    return out


def read(conn: Connection, now: float, settings: Settings, *, nodes: bool = True) -> Rows:
    """Models, nodes and replicas as the views show them, each table read once (the
    nodes left out, an empty list, when ``nodes`` is false: the Models page)."""
    with paused():
        model_rows, node_rows, replica_rows, parts, reports = HELD.fleet(conn)
        models = models_of(model_rows, replica_rows, now, settings.backoff)
        node_dicts, facts = DECODED.nodes(node_rows, reports) if nodes else ([], {})
        replicas = [DECODED.replica(r, parts.get(r.id), now) for r in sliced(replica_rows)]
    return Rows(now, models, node_dicts, replicas, facts)


def build(rows: Rows, settings: Settings, *, idle_after_s: float,
          store: dict[str, Any]) -> dict[str, Any]:
    """The summary of rows read by ``read`` (pure)."""
    with paused():
        return status_summary.build(rows.models, rows.nodes, rows.replicas, rows.now,
                                    settings.node_timeout_s, idle_after_s=idle_after_s,
                                    store=store, facts=rows.facts)


def summary(conn: Connection, now: float, settings: Settings, *, idle_after_s: float,
            store: dict[str, Any]) -> dict[str, Any]:
    """The fleet summary every status view renders, from one read of the store."""
    return build(read(conn, now, settings), settings, idle_after_s=idle_after_s,
                 store=store)
