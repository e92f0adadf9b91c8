"""The leader's fleet in memory (issue 30): each reconcile pass reads only what changed.

``View.refresh(conn)`` returns the same ``decide.Fleet`` as ``fleet.read(conn)`` would in
that transaction (the divergence test, tests/control/test_incremental.py, compares them
after every pass of randomised operations; with ``heard_s``, report times aside, below),
reading:

- what the store's change log names since the last pass (``store.changes.since``): those
  nodes, models and replicas (with their worker parts) are read again, deleted ones leave;
  of a node whose only entry is its device readings (kind telemetry) only ``devices``;
- every row's *volatile* columns, the ones written without a change log entry, in three
  narrow reads: a node's ``last_report`` (the heartbeat writer's batches; their device
  readings are logged, kind telemetry) and ``plan_problem`` (the pass's own), a replica's
  ``last_used`` and ``in_flight`` (the routers' posts), and every column of a model that
  is not a field of its catalog entry (its fleet state: the routers' load and capacity,
  activations, failures, rollout state: ``update_model`` and ``merge_rollout_state`` log
  only launch fields). A row whose volatile columns moved gets them; a key the narrow read
  finds that the view lacks (a node written without a log entry, as before revision
  0019) is read whole, one the view has that the read lacks is dropped. The reconciler's
  view (``heard_s``) reads a node's report columns again only once the report time it
  holds is ``heard_s / 2`` old (none: only a logged write gives it one): a time it holds
  is then an earlier report's than the store's, but says the same at the pass (the node
  is heard within the node timeout, not silent past replace_after_s), and 10,000 nodes
  reporting every 2 s are read a few hundred a pass, not all of them. It learns of a
  node that joined from the join's log entry (``repo.set_node_credential``): a read of
  the nodes never heard from was a scan of the whole table each pass (an index on
  ``last_report`` would cost every heartbeat's update its HOT path).

Everything is read again on the first pass, after :meth:`View.reset` (the reconciler calls
it when it takes the lease and when a pass fails) and when the log says so
(``Changed.everything``: a kind 'all' entry, or the log was pruned past the last pass).
The periodic full check is rolling: each pass also reads again the rows whose key hashes
to its turn, so every row is read again once every ``full_every`` passes
(:data:`FULL_EVERY`, about a minute), which bounds how long anything written outside these
rules could go unseen, at a sixtieth of a full read each pass instead of a full read (and
a pass that makes every planner view again) once a minute. A row read again unchanged
stays the same object, so the planner views made of it (control/snapshot.py) are kept.

Why this equals a full read: the change log's entries carry the generation of the
transaction that wrote them, in commit order (store/db.py ``bump``), and ``since`` is read
first, so every row read after it is at least as new as that generation; whatever commits
meanwhile is named by the next pass's entries and read again then. The pass's own writes
are logged (replicas, node drains) or volatile columns (models, ``plan_problem``).

Rows are held as ``SimpleNamespace`` objects (decide.py copies what it changes), every
column but a node's ``credential_hash``; a node's volatile columns and new device readings
are patched into its record in place, any other change of a row gives it a new record
(with ``reports_apart``, readings give a new record too); order is
``fleet.read``'s: models and nodes by name, replicas by model and start.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from operator import attrgetter
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..store import changes, repo
from ..store.schema import models as models_table
from ..store.schema import nodes as nodes_table
from ..store.schema import replica_parts
from ..store.schema import replicas as replicas_table
from . import viewrows
from .decide import Fleet
from .viewrows import (
    MODEL_VOLATILE,
    NODE_VOLATILE,
    REPLICA_VOLATILE,
    chunks,
    named,
    narrow,
    narrow_rows,
    node_record,
    patched,
    record,
    replica_query,
    same_or_new,
)

_REPLICA_ORDER = attrgetter("model", "started", "id")     # fleet.read's order
FULL_EVERY = 60        # every row is read again once in this many passes (rolling)
_SERIALS = itertools.count(1)    # each fleet a view hands out, in every view of the process

class View:
    """The fleet as the leader last read it, and the change log generation it is at."""

    def __init__(self, full_every: int = FULL_EVERY, *, reports_apart: bool = False,
                 heard_s: float | None = None) -> None:
        self.full_every = full_every
        # With ``heard_s`` (the reconciler's: the node timeout, or replace_after_s when
        # shorter) and a pass's ``now``: a node's report columns are read again only once
        # the report time held is ``heard_s / 2`` old (or none), not every node's every
        # pass (:meth:`_reports`)
        self.heard_s = heard_s
        # True (the status summary's view): a node's volatile columns, which move with
        # every report, are kept in ``reports`` (name -> (name, last_report, plan_problem))
        # and not patched into its record, whose own are as of its last read: the
        # summary reads them from there, and a steady fleet's records stay the same objects
        self.reports_apart = reports_apart
        self.reports: dict[str, tuple[Any, ...]] = {}
        self.generation: int | None = None
        self.models: dict[str, SimpleNamespace] = {}
        self.nodes: dict[str, SimpleNamespace] = {}
        self.replicas: dict[str, SimpleNamespace] = {}
        self.parts: dict[str, list[SimpleNamespace]] = {}
        self.passes = 0                  # passes since the last full read
        self.last_full = False           # whether the last refresh read everything
        self.fulls = 0                   # full reads so far
        self._ordered: list[SimpleNamespace] | None = None
        # the nodes whose records changed (a new record, or columns set in place) since the
        # last fleet handed out (``_serial``); None: unknown (everything was read)
        self._touched: set[str] | None = None
        self._serial: int | None = None
        # what the last narrow read of each table found: key -> (key, *volatile columns)
        self._last: dict[str, dict[str, tuple[Any, ...]]] = {}
        # (a report time, node) for the times reads set (:meth:`_due`)
        self._times: list[tuple[float, str]] = []
        # each table's keys, and those keys by their turn of the rolling check (``_slice``)
        self._turns: dict[str, tuple[frozenset[str], dict[int, frozenset[str]]]] = {}

    def reset(self) -> None:
        """Forget everything: the next refresh reads the whole fleet."""
        self.generation = None

    # ------------------------------------------------------------ one pass

    def refresh(self, conn: Connection, now: float | None = None) -> Fleet:
        """Bring the view up to the store as this transaction reads it; the fleet. With
        ``heard_s`` and ``now`` (the pass's store clock), a node's ``last_report`` may be
        an earlier report's than the store's: one at most ``heard_s / 2`` old, so every
        answer drawn from it at ``now`` (heard within the node timeout, silent past
        replace_after_s: control/decide.py, the planner, the device clock) is the
        store's."""
        changed = changes.since(conn, self.generation)
        if changed.everything or self.generation is None:
            self._read_all(conn)
        else:
            self.passes += 1
            self.last_full = False
            turn = self.passes % self.full_every
            self._read_models(conn, changed.models | self._slice("models", self.models, turn))
            whole = changed.nodes - changed.telemetry_only
            whole |= self._slice("nodes", self.nodes, turn)
            self._read_nodes(conn, whole)
            self._read_devices(conn, changed.telemetry_only - whole)
            self._read_replicas(conn, changed.replicas
                                | self._slice("replicas", self.replicas, turn))
            self._volatile(conn, now)
        self.generation = changed.generation
        return self.fleet()

    def _slice(self, table: str, rows: dict[str, Any], turn: int) -> frozenset[str]:
        """The keys this pass reads again whatever the log says: those whose hash falls
        on ``turn``, so that every row is read again once every ``full_every`` passes.
        The keys are put in their turns again only when they are other keys than the last
        time (hashing 15,000 keys every pass cost a few milliseconds)."""
        held = self._turns.get(table)
        if held is None or held[0] != rows.keys():
            turns: dict[int, set[str]] = {}
            for k in rows:
                turns.setdefault(hash(k) % self.full_every, set()).add(k)
            held = self._turns[table] = (
                frozenset(rows), {t: frozenset(keys) for t, keys in turns.items()})
        return held[1].get(turn, frozenset())

    def fleet(self) -> Fleet:
        """The fleet as held now, with the nodes whose records changed since the fleet
        handed out before (``Fleet.nodes_since``: the planner's node views are looked up
        again only for those, control/snapshot.py ``NodeMemo.views``)."""
        if self._ordered is None:
            self._ordered = sorted(self.replicas.values(), key=_REPLICA_ORDER)
        serial = next(_SERIALS)
        since = None if self._touched is None or self._serial is None else (
            self._serial, serial, frozenset(self._touched))
        self._serial, self._touched = serial, set()
        return Fleet(models=self.models, nodes=self.nodes, replicas=self._ordered,
                     parts=self.parts, nodes_since=since)

    def _touch(self, names: Iterable[str]) -> None:
        if self._touched is not None:
            self._touched.update(names)

    # ------------------------------------------------------------ reads

    def _read_all(self, conn: Connection) -> None:
        """Read everything; rows that did not change stay the objects they were."""
        models, nodes, replicas = self.models, self.nodes, self.replicas
        self.models = {m.name: same_or_new(models.get(m.name), record(m))
                       for m in repo.list_models(conn, deleted=True)}
        self.nodes = {n.name: same_or_new(nodes.get(n.name), node_record(n))
                      for n in repo.list_nodes(conn)}
        self.replicas = {r.id: same_or_new(replicas.get(r.id), record(r))
                         for r in repo.list_replicas(conn)}
        self.parts = {rid: [record(p) for p in parts]
                      for rid, parts in repo.parts_by_replica(conn).items()}
        self.reports = {name: (name, *(getattr(row, c) for c in NODE_VOLATILE))
                        for name, row in self.nodes.items()}
        self._times = []
        self._timed(self.nodes)
        self._ordered = None
        self._last = {}
        self._touched = None
        self.passes = 0
        self.last_full = True
        self.fulls += 1

    def _read_models(self, conn: Connection, names: Iterable[str]) -> None:
        names = set(names)
        if not names:
            return
        found = named(conn, models_table, names, record)
        hashes = {}
        for name in names:
            before = self.models.get(name)
            row = found.get(name)
            new_hash = row.definition_hash if row is not None else None
            if before is None or before.definition_hash != new_hash:
                hashes[name] = new_hash
        self.models = self._merged(self.models, found, names)
        self._rehash(hashes)

    def _rehash(self, hashes: dict[str, str | None]) -> None:
        """Replicas of models whose definition moved, with their ``model_hash``."""
        if not hashes:
            return
        for rid, rep in list(self.replicas.items()):
            if rep.model in hashes and rep.model_hash != hashes[rep.model]:
                self.replicas[rid] = patched(rep, {"model_hash": hashes[rep.model]})
                self._ordered = None

    def _read_nodes(self, conn: Connection, names: Iterable[str]) -> None:
        names = set(names)
        if not names:
            return
        self._touch(names)
        self.nodes = self._merged(self.nodes, named(conn, nodes_table, names, node_record),
                                  names)
        self._timed(names)

    def _read_devices(self, conn: Connection, names: Iterable[str]) -> None:
        """Nodes whose only change is their device readings (kind telemetry: hundreds a
        second in a fleet of 10,000 whose GPUs warm and cool): their ``devices`` alone,
        patched into the record (in place for the leader's view, as its report columns
        are; a copy for one that keeps reports apart, whose users know a record by its
        identity). A node the view lacks, or one gone, is read whole."""
        names = set(names)
        if not names:
            return
        self._touch(names)
        found: dict[str, str] = {}
        for chunk in chunks(names):
            found.update((name, devices) for name, devices in conn.execute(
                sa.select(nodes_table.c.name, nodes_table.c.devices)
                .where(nodes_table.c.name.in_(chunk))))
        whole = set()
        copies = {}
        for name in names:
            row = self.nodes.get(name)
            devices = found.get(name)
            if row is None or devices is None:
                whole.add(name)
            elif row.devices != devices:
                if self.reports_apart:
                    copies[name] = patched(row, {"devices": devices})
                else:
                    row.devices = devices
        if copies:
            self.nodes = {**self.nodes, **copies}
        self._read_nodes(conn, whole)

    def _read_replicas(self, conn: Connection, ids: Iterable[str]) -> None:
        ids = set(ids)
        if not ids:
            return
        for chunk in chunks(ids):
            rows = {r.id: record(r) for r in conn.execute(
                replica_query().where(replicas_table.c.id.in_(chunk)))}
            parts: dict[str, list[SimpleNamespace]] = {}
            for p in conn.execute(sa.select(replica_parts)
                                  .where(replica_parts.c.replica_id.in_(chunk))
                                  .order_by(replica_parts.c.replica_id, replica_parts.c.rank)):
                parts.setdefault(p.replica_id, []).append(record(p))
            for rid in chunk:
                before = self.replicas.get(rid)
                if rid in rows:
                    self.replicas[rid] = same_or_new(before, rows[rid])
                else:
                    self.replicas.pop(rid, None)
                old = self.parts.get(rid)
                if rid in parts:
                    same = old is not None and len(old) == len(parts[rid]) and all(
                        vars(a) == vars(b) for a, b in zip(old, parts[rid], strict=True))
                    self.parts[rid] = old if same and old is not None else parts[rid]
                else:
                    self.parts.pop(rid, None)
                if self.replicas.get(rid) is not before:
                    self._ordered = None

    @staticmethod
    def _merged(rows: dict[str, SimpleNamespace], found: dict[str, SimpleNamespace],
                asked: set[str]) -> dict[str, SimpleNamespace]:
        """``rows`` with the keys ``asked`` read again (``found``: those still there), in
        key order."""
        added = set(found) - set(rows)
        out = dict(rows)
        for key in asked:
            if key in found:
                out[key] = same_or_new(rows.get(key), found[key])
            else:
                out.pop(key, None)
        if added:
            out = {k: out[k] for k in sorted(out)}
        return out

    # ------------------------------------------------------------ volatile columns

    def _volatile(self, conn: Connection, now: float | None) -> None:
        if self.reports_apart:
            self.reports = narrow(conn, nodes_table, "name", NODE_VOLATILE)
            if self.reports.keys() != self.nodes.keys():    # joined, or gone
                self._touch(self.nodes.keys() ^ self.reports.keys())
                self.nodes = {k: v for k, v in self.nodes.items() if k in self.reports}
                self._read_nodes(conn, set(self.reports) - set(self.nodes))
        else:
            self._read_nodes(conn, self._reports(conn, now))
        before = {n: m.definition_hash for n, m in self.models.items()}
        self.models, new_models = self._columns(
            conn, models_table, "name", MODEL_VOLATILE, self.models)
        self._read_models(conn, new_models)
        self._rehash({n: m.definition_hash for n, m in self.models.items()
                      if before.get(n, m.definition_hash) != m.definition_hash}
                     | dict.fromkeys(set(before) - set(self.models)))
        replicas, new_replicas = self._columns(
            conn, replicas_table, "id", REPLICA_VOLATILE, self.replicas)
        if replicas is not self.replicas:
            gone = set(self.replicas) - set(replicas)
            self.replicas = replicas
            for rid in gone:
                self.parts.pop(rid, None)
            self._ordered = None
        self._read_replicas(conn, new_replicas)

    def _reports(self, conn: Connection, now: float | None) -> set[str]:
        """Nodes' report columns (``NODE_VOLATILE``) as stored now, set into their records
        in place (half the nodes report each pass, and the planner's node memo knows a
        record it saw before by its identity and report time, control/snapshot.py
        ``NodeMemo``); a node gone leaves. Returns the names stored that the view lacks.
        Set without comparing: at 10,000 nodes the compare with the last read cost more
        than the setting.

        Every node's, or with ``heard_s`` and ``now`` only those whose report time held is
        ``heard_s / 2`` old or more: a node reporting every 2 s is read about every
        ``heard_s / 2`` s, not every pass. The others' times are earlier than the store's
        but within ``heard_s / 2`` of ``now``, so every answer the pass draws from them is
        the same (heard, not silent). A node held with no report time (never reported,
        or its agent stopped) is not read: only a logged write gives it one (a first
        report after none, ``repo.record_report``; heartbeats never revive a node), and
        the log has it read whole. ``plan_problem`` is set by :meth:`wrote`."""
        nodes = self.nodes
        new = set()
        if self.heard_s is None or now is None:
            found = narrow_rows(conn, nodes_table, "name", NODE_VOLATILE)
            asked = None
            self._touch(nodes)
        else:
            asked = self._due(now - self.heard_s / 2)
            found = viewrows.reports_of(conn, asked)
            self._touch(asked)
        for name, last_report, plan_problem in found:
            row = nodes.get(name)
            if row is None:
                new.add(name)
            else:
                row.last_report, row.plan_problem = last_report, plan_problem
        self._timed(values[0] for values in found)
        if asked is None and len(found) - len(new) != len(nodes):       # a node went
            stored = {values[0] for values in found}
            self.nodes = {k: v for k, v in nodes.items() if k in stored}
        elif asked:
            gone = asked - {values[0] for values in found}
            if gone:
                self.nodes = {k: v for k, v in nodes.items() if k not in gone}
        return new

    def _due(self, before: float) -> set[str]:
        """The nodes whose report time held is before ``before``, from ``_times``: a heap
        of (a report time, node) with an entry for each time a read set (:meth:`_timed`),
        so a pass pops the few hundred due instead of walking 10,000 nodes. An entry is
        the node's only while the node holds its time: one whose node holds another (a
        later read pushed that one), is gone or holds none is dropped, so a node read
        whole every pass leaves no trail of entries."""
        times, nodes, due = self._times, self.nodes, set()
        while times and times[0][0] < before:
            when, name = heapq.heappop(times)
            row = nodes.get(name)
            if row is not None and row.last_report == when:
                due.add(name)
        return due

    def _timed(self, names: Iterable[str]) -> None:
        """An entry in ``_times`` for each of ``names`` held with a report time, in a view
        with ``heard_s`` (the only one that pops them: another's would only grow)."""
        if self.heard_s is None:
            return
        for name in names:
            row = self.nodes.get(name)
            if row is not None and row.last_report is not None:
                heapq.heappush(self._times, (row.last_report, name))

    def wrote(self, node_problems: dict[str, str | None]) -> None:
        """The pass's own writes that no log entry names, set into the records: each
        node's ``plan_problem`` (``decide.Changes.node_problems``), which the next pass
        reads again only with the node's report time (:meth:`_reports`)."""
        self._touch(node_problems)
        for name, problem in node_problems.items():
            row = self.nodes.get(name)
            if row is not None:
                row.plan_problem = problem

    def _columns(self, conn: Connection, table: Any, key: str, columns: tuple[str, ...],
                 rows: dict[str, SimpleNamespace]
                 ) -> tuple[dict[str, SimpleNamespace], set[str]]:
        """``rows`` with ``columns`` as stored now (the same dict when none moved and no
        row went), and the keys stored that ``rows`` lacks. Each row's values
        (``narrow``) are compared with what the previous read of the table found, and only
        a tuple that differs patched into a copy of its row."""
        found = narrow(conn, table, key, columns)
        last = self._last.get(table.name, {})
        self._last[table.name] = found
        moved: dict[str, SimpleNamespace] = {}
        new: set[str] = set()
        for name, values in found.items():
            row = rows.get(name)
            if row is not None and last.get(name) == values:
                continue
            if row is None:
                new.add(name)
            elif any(getattr(row, c) != v for c, v in zip(columns, values[1:], strict=True)):
                moved[name] = patched(row, dict(zip(columns, values[1:], strict=True)))
        if not moved and len(found) - len(new) == len(rows):
            return rows, new
        out = {k: moved.get(k, v) for k, v in rows.items() if k in found}
        return out, new
