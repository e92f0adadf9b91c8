"""What a node's report changes, and what lets a steady node's report cost no store access.

Every agent reports every few seconds; at 10,000 agents that is the control service's hot
path (bench/control_bench.py). A report (or a heartbeat, control/heartbeat.py) is handled
one of two ways (docs/architecture.md):

- **In a transaction** (the first report, and every report that changes something: a
  replica's state, the node's address, problem, engines, weights or hardware, a stopping
  agent): the credential is checked, the node and its replicas are written and the answer
  is read, as one transaction.
- **From this process's caches** (a report that repeats what is stored): the credential,
  the node's stored state, its answer and its last full report are cached per process.
  Such a report only refreshes the node's last report time and its devices, which are
  batched (``beats.Heartbeats``) and written a fraction of a second later.

The caches follow the store's change log (store/changes.py): every write that could change
what they hold names the nodes, models and replicas it changed, and a process forgets only
those (a node's entries when its row or one of its replicas changed, the answers running a
model when the model changed), so a change elsewhere in the fleet does not send every
node's next report through a transaction. The log is read at most every
``GENERATION_TTL_S`` per process, and at once after this process committed a change, so a
change made elsewhere (a new replica from the reconciler process, a credential reset
through another worker) is seen by the reports that come after that at the latest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from ..api.agent import Assignment, ReplicaReport, Report, ReportAnswer
from ..api.states import LIVE_REPLICA_STATES, ReplicaState, ReportedState
from ..errors import StoreError
from ..store import Store, changes, repo
from ..store.changes import Changed
from .assignments import part_id

log = logging.getLogger(__name__)

GENERATION_TTL_S = 0.25     # how stale this process's view of the generation may be


# ------------------------------------------------------------------ pure: what changes


def progress_of(rep: ReplicaReport) -> str | None:
    """A fetching replica's download progress as the ``progress`` column holds it."""
    progress = rep.progress
    if rep.state != ReportedState.FETCHING or progress is None:
        return None
    keep: dict[str, Any] = {"bytes": progress.bytes}
    if progress.total is not None:
        keep["total"] = progress.total
    keep["rate_bps"] = progress.rate_bps
    return json.dumps(keep)


# A wanted replica in one of these states that its agent no longer lists was lost with the
# agent: an agent forgets a replica only when it is told to stop it, or when it restarts
# and finds no engine to adopt (the node rebooted, `llmgw up` was stopped and stopped its
# engines). That says nothing of whether the model starts: its row goes (no failed start,
# no backoff) and the reconciler places a new replica. One that is `unreachable` stays a
# failure: a router found its engine gone while the agent ran.
LOST_WITH_AGENT = (ReplicaState.FETCHING, ReplicaState.STARTING, ReplicaState.READY)


@dataclass(frozen=True)
class HeadChange:
    """What a report changes of one replica the node heads: ``delete`` (stopped as asked,
    or ``lost`` with a restarted agent), or new ``values`` for its row; ``gone`` when it
    gets no assignment any more."""

    row: Any
    delete: bool = False
    values: dict[str, Any] | None = None
    gone: bool = False
    stopped: bool = False
    lost: bool = False


def head_change(row: Any, rep: ReplicaReport | None, now: float) -> HeadChange | None:
    """What the agent's word ``rep`` (None: it does not run it) changes of ``row``."""
    if rep is None:
        if not row.desired:
            return HeadChange(row, delete=True, gone=True)
        if row.state in LOST_WITH_AGENT:
            return HeadChange(row, delete=True, gone=True, lost=True)
        if row.state in LIVE_REPLICA_STATES:
            return HeadChange(row, values={
                "state": "failed", "updated": now,
                "last_error": f"the agent on {row.node} no longer runs this replica"}, gone=True)
        return None
    if not row.desired or row.state == "failed":
        return None
    stopped = rep.state == ReportedState.STOPPED
    state = (ReplicaState.FAILED if stopped else ReplicaState(rep.state.value)).value
    values: dict[str, Any] = {"state": state, "port": rep.port, "pid": rep.pid,
                              "updated": now, "progress": progress_of(rep)}
    if row.state == ReplicaState.READY and state in (ReplicaState.PENDING,
                                                     ReplicaState.STARTING):
        # its engine starts again (the agent's supervisor restarted it): the start timeout
        # counts from now, not from when it was placed, or an engine that restarts after
        # start_timeout_s of serving would count as a failed start at once: replaced, its
        # model backed off (and parked at the fifth in a row)
        values["started"] = now
    if state == ReplicaState.FAILED:
        values["last_error"] = rep.last_error or "the engine stopped"
    elif state == ReplicaState.READY:
        values["last_error"] = None                  # the history stays in the events
    if all(getattr(row, k) == v for k, v in values.items() if k != "updated"):
        return None                                  # nothing new: no write
    return HeadChange(row, values=values, gone=state == ReplicaState.FAILED, stopped=stopped)


def part_change(part: Any, rep: ReplicaReport | None, now: float) -> dict[str, Any] | None:
    """The new values of a worker part's row from the agent's word, or None."""
    if part.state == "failed":
        return None
    if rep is None:
        if part.state in ("starting", "ready"):
            return {"state": "failed", "updated": now,
                    "last_error": f"the agent on {part.node} no longer runs this part"}
        return None
    state = "failed" if rep.state == ReportedState.STOPPED else rep.state.value
    error = (rep.last_error or "the engine stopped") if state == "failed" else None
    if state != part.state or rep.pid != part.pid:
        return {"state": state, "pid": rep.pid, "last_error": error, "updated": now}
    return None


def unchanged(heads: list[Any], parts: list[Any], reported: dict[str, ReplicaReport]) -> bool:
    """Whether a report says nothing new of the node's replicas and parts."""
    return all(head_change(row, reported.get(row.id), 0.0) is None for row in heads) and \
        all(part_change(p, reported.get(part_id(p.replica_id, p.rank)), 0.0) is None
            for p in parts)


# ------------------------------------------------------------------ writing it


def apply_heads(conn: Any, heads: list[Any], reported: dict[str, ReplicaReport],
                now: float) -> set[str]:
    """Write what the agent says of the replicas it heads; returns the ids that are gone
    or failed now (they get no assignment)."""
    gone: set[str] = set()
    for row in heads:
        change = head_change(row, reported.get(row.id), now)
        if change is None:
            continue
        if change.gone:
            gone.add(row.id)
        if change.delete:
            repo.delete_replica(conn, row.id)
            if change.lost:
                repo.add_event(conn, now, "lost", row.model, lost_message(row))
        elif change.values is not None:
            repo.update_replica(conn, row.id, **change.values)
            state = change.values["state"]
            if reported.get(row.id) is not None and state != row.state:
                _replica_event(conn, row, state, change.values.get("last_error"),
                               change.stopped, now)
    return gone


def lost_message(row: Any) -> str:
    """The event of a replica lost with its agent (``LOST_WITH_AGENT``)."""
    return (f"replica {row.id} on {row.node} ({row.state}) is gone: the agent on {row.node} "
            "restarted and no longer runs it (its node restarted, or its engines were "
            "stopped with it); not a failed start: a new replica is placed")


def _replica_event(conn: Any, row: Any, state: str, error: str | None, stopped: bool,
                   now: float) -> None:
    """The event of a replica that became ready or failed; a ready replica clears its
    model's last error (a model that serves again shows no stale error; `ctl events`
    keeps it)."""
    where = f"replica {row.id} on {row.node}"
    if state == ReplicaState.READY:
        again = (" again (its agent reports it ready after a router could not reach it)"
                 if row.state == ReplicaState.UNREACHABLE else "")
        repo.add_event(conn, now, "ready", row.model, f"{where} is ready{again}")
        model = repo.get_model(conn, row.model)
        if model is not None and model.last_error is not None:
            repo.update_model(conn, row.model, last_error=None)
    elif state == ReplicaState.FAILED:
        repo.add_event(conn, now, "stopped" if stopped else "failed", row.model,
                       f"{where} " + ("stopped" if stopped else "is failed") + f": {error}")


def apply_parts(conn: Any, parts: list[Any], reported: dict[str, ReplicaReport],
                now: float) -> set[str]:
    """The same for worker parts on this node; returns the part ids failed now."""
    gone: set[str] = set()
    for part in parts:
        pid = part_id(part.replica_id, part.rank)
        values = part_change(part, reported.get(pid), now)
        if values is None:
            continue
        if values["state"] == "failed":
            gone.add(pid)
        repo.update_part(conn, part.replica_id, part.rank, **values)
    return gone


# ------------------------------------------------------------------ the answer


def report_answer(report: Report, interval_s: float, assignments: list[Assignment],
                  problem: str | None, sources: tuple[list[str], str]) -> ReportAnswer:
    """The answer to ``report``, however it was handled: the node's assignments, when to
    report next, what of the report is not used (``problem``), and the catalog's sources
    (with their hash) when the agent's hash of them is not theirs."""
    extra: dict[str, Any] = {}
    if problem:
        extra["problems"] = [problem]
    listed, digest = sources
    if report.sources_hash is not None and report.sources_hash != digest:
        extra.update(sources=listed, sources_hash=digest)
    return ReportAnswer(assignments=assignments, report_interval_s=interval_s, **extra)


# ------------------------------------------------------------------ this process's caches


@dataclass(frozen=True)
class Answer:
    """A node's replica rows and assignments, the devices they were made for, and the
    models they run (a change of one of those drops the answer)."""

    devices: tuple[Any, ...]
    heads: list[Any]
    parts: list[Any]
    assignments: list[Assignment]
    models: frozenset[str]


@dataclass(frozen=True)
class NodeEntry:
    """A node as stored after a report handled in a transaction."""

    name: str
    address: str | None
    problem: str | None
    inventory: str | None


@dataclass(frozen=True)
class Applied:
    """What one reading of the change log (generations ``since`` to ``to``) forgot."""

    since: int
    to: int
    nodes: frozenset[str]
    models: frozenset[str]


@dataclass(frozen=True)
class Held:
    """A node's last full report (as its heartbeats change it), by the digest its agent's
    heartbeats name (api/agent.py ``report_digest``), with its inventory digest and its
    devices as stored (``repo.inventory_of``, ``repo.devices_of``)."""

    digest: str
    report: Report
    inventory: str
    devices: str


class ReportCache:
    """Per process: credentials, node states, answers, the nodes' last full reports and the
    catalog's sources, brought up to the store's "fleet" generation (:meth:`current`) by
    forgetting what the change log names since the generation they reflect (``seen``).
    The sources are read again with the log when a model changed: a catalog apply leaves
    every steady node's heartbeat in memory (before, each then went through a transaction
    until one of them cached the sources again: a storm of them at 10,000 nodes)."""

    LIMIT = 20_000      # entries of each map (a fleet larger than this is re-read in full)

    def __init__(self) -> None:
        self.nodes: dict[str, NodeEntry] = {}       # credential hash -> node
        self.credential_of: dict[str, str] = {}     # node name -> credential hash
        self.answers: dict[str, Answer] = {}        # node name -> answer
        self.reports: dict[str, Held] = {}          # node name -> its last full report
        self.sources: tuple[list[str], str] | None = None
        self.answered: dict[str, Any] = {}          # node name -> its last steady answer
        self.seen: int | None = None                # the generation all of it reflects
        self._applied: deque[Applied] = deque(maxlen=256)   # what the last polls forgot
        self._polled: tuple[float, int] = (-1e9, 0)  # (when, the store's moves then)
        self._lock = threading.Lock()
        # told the nodes the change log named (None: perhaps any): Heartbeats.unwritten
        self.named: Callable[[Collection[str] | None], None] = lambda nodes: None

    def current(self, store: Store) -> int | None:
        """The generation the caches reflect, read at most ``GENERATION_TTL_S`` ago (or
        the last read's, while another request reads it again), and at once after this
        process committed a change; None: unknown (the store failed; the transaction path
        says what is wrong)."""
        at, moves = self._polled
        if moves == store.moves and (time.monotonic() - at <= GENERATION_TTL_S
                                     or self._lock.locked()):
            # fresh, or another request is reading the log now: answer from the last
            # read meanwhile (in a loaded gevent worker that read's round trips wait
            # behind every ready request, and all of them waited for it: seconds of tail
            # at 10,000 nodes). Never past a commit of this process not read yet.
            return self.seen
        with self._lock:                       # one reader per process at a time
            at, moves = self._polled
            if time.monotonic() - at <= GENERATION_TTL_S and moves == store.moves:
                return self.seen
            moves = store.moves                # this process's own writes: seen at once
            sources = None
            try:
                with store.begin() as conn:
                    read = changes.since(conn, self.seen)
                    if self.sources is None or read.everything or read.models:
                        sources = self._read_sources(conn)
                changed: Changed | None = read
            except StoreError:
                changed = None
            kept = self.sources
            self._apply(changed)
            if sources is not None and changed is not None:
                # read after the log, so at least as new as what it names; the same
                # sources stay the same object (heartbeat.Answered holds it)
                self.sources = kept if kept == sources else sources
            self._polled = (time.monotonic(), moves)
        return self.seen

    def _apply(self, changed: Changed | None) -> None:
        """Forget what ``changed`` names (None or ``everything``: all of it): a node's
        credential entry and answer when its row, its replicas or a replica sharing one of
        its nodes changed; the sources, and the answers that run a model, when the model
        did. Telemetry (device readings) changes nothing cached. Held reports stay: they
        are what the agents said."""
        self.named(None if changed is None or changed.everything else changed.nodes)
        if changed is None or changed.everything:
            self.nodes.clear()
            self.credential_of.clear()
            self.answers.clear()
            self.sources = None
            self.seen = None if changed is None else changed.generation
            self._applied.clear()
            return
        gone = set(changed.nodes - changed.telemetry_only)
        if changed.models:
            self.sources = None
            gone.update(n for n, a in self.answers.items() if a.models & changed.models)
        self.forget_nodes(gone)
        if self.seen is not None and changed.generation != self.seen:
            self._applied.append(Applied(self.seen, changed.generation, frozenset(gone),
                                         changed.models))
        self.seen = changed.generation

    def _missed(self, stamp: int, name: str | None, models: frozenset[str] | None) -> bool:
        """Whether what this process forgot after generation ``stamp`` may have named node
        ``name`` or one of ``models`` (None: any model); also when that is not known so
        far back. A transaction that read under ``stamp`` may not have seen such a change,
        so what it read is not cached."""
        if self.seen is None:
            return True
        if stamp >= self.seen:
            return False
        later = [a for a in self._applied if a.to > stamp]
        if not later or later[0].since > stamp:
            return True
        return any(name in a.nodes or (a.models if models is None else a.models & models)
                   for a in later)

    def forget_nodes(self, names: set[str]) -> None:
        for name in names:
            self.answers.pop(name, None)
            key = self.credential_of.pop(name, None)
            if key is not None:
                self.nodes.pop(key, None)

    def forget(self, names: list[str]) -> None:
        """Nodes whose stored state moved on (another process wrote a newer report, or
        their agent said it stopped): their next report is handled in a transaction."""
        if names:
            with self._lock:
                for name in names:
                    key = self.credential_of.pop(name, None)
                    if key is not None:
                        self.nodes.pop(key, None)

    def put(self, stamp: int | None, token_hash: str, entry: NodeEntry,
            answer: Answer, sources: tuple[list[str], str]) -> None:
        """Cache what a transaction read under generation ``stamp`` (read with the
        credential): unless what this process forgot since ``stamp`` (changes it has
        applied already, which this transaction may not have seen) named the node or its
        models; the sources only when no model changed since."""
        with self._lock:
            if stamp is None or self._missed(stamp, entry.name, answer.models):
                return
            fresh = self.sources is None and not self._missed(stamp, None, None)
            if len(self.nodes) >= self.LIMIT or len(self.answers) >= self.LIMIT:
                self._apply(None)
                return
            old = self.credential_of.get(entry.name)
            if old is not None and old != token_hash:
                self.nodes.pop(old, None)
            self.nodes[token_hash] = entry
            self.credential_of[entry.name] = token_hash
            self.answers[entry.name] = answer
            if fresh:
                self.sources = sources

    def hold(self, node: str, held: Held) -> None:
        """Keep a node's last full report (its heartbeats name it by its digest)."""
        if len(self.reports) >= self.LIMIT and node not in self.reports:
            self.reports.clear()
        self.reports[node] = held

    def remember(self, answered: Any) -> None:
        """Keep a node's last steady heartbeat answer (``heartbeat.Answered``)."""
        if len(self.answered) >= self.LIMIT and answered.entry.name not in self.answered:
            self.answered.clear()
        self.answered[answered.entry.name] = answered

    def answer(self, node: str, devices: tuple[Any, ...]) -> Answer | None:
        hit = self.answers.get(node)
        return hit if hit is not None and hit.devices == devices else None

    def catalog_sources(self, conn: Any) -> tuple[list[str], str]:
        """The catalog's sources and their hash (agents look for these in their weights
        directories): cached ones, else read in ``conn``."""
        if self.sources is not None:
            return self.sources
        return self._read_sources(conn)

    @staticmethod
    def _read_sources(conn: Any) -> tuple[list[str], str]:
        sources = repo.model_sources(conn)
        return sources, hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16]
