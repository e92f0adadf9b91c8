"""What a node's report changes, and what lets a steady node's report cost no store access.

Every agent reports every few seconds; at 2,000 agents that is the control service's hot
path (bench/control_bench.py). A report is handled one of two ways (docs/architecture.md):

- **In a transaction** (the first report, and every report that changes something: a
  replica's state, the node's address, problem, engines, weights or hardware, a stopping
  agent): the credential is checked, the node and its replicas are written and the answer
  is read, as one transaction.
- **From this process's caches** (a report that repeats what is stored): the credential,
  the node's stored state and its answer are cached per process, valid while the store's
  "fleet" generation stands still (every write that could change them moves it, when it
  commits: store/db.py). Such a report only refreshes the node's last report time and its
  devices, which are batched (:class:`Heartbeats`) and written a fraction of a second later.

The generation is read from the store at most every ``GENERATION_TTL_S`` per process, and at
once after this process committed a change, so a change made elsewhere (a new replica from
the reconciler process, a credential reset through another worker) is seen by the reports
that come after that at the latest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ..api.agent import Assignment, ReplicaReport, Report, ReportAnswer
from ..api.states import LIVE_REPLICA_STATES, ReplicaState, ReportedState
from ..errors import StoreError
from ..store import Store, repo
from .assignments import part_id

log = logging.getLogger(__name__)

GENERATION_TTL_S = 0.25     # how stale this process's view of the generation may be
FLUSH_EVERY_S = 0.25        # how long a refreshed last report time may wait to be written


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


class Versioned(Protocol):
    @property
    def generation(self) -> int: ...


E = TypeVar("E", bound=Versioned)


class ByGeneration(Generic[E]):
    """A bounded map whose entries count only under the generation they were made in."""

    LIMIT = 20_000

    def __init__(self) -> None:
        self.entries: dict[str, E] = {}

    def get(self, key: str, generation: int | None) -> E | None:
        entry = self.entries.get(key)
        if entry is None or generation is None or entry.generation != generation:
            return None
        return entry

    def put(self, key: str, entry: E) -> None:
        if len(self.entries) >= self.LIMIT:
            self.entries.clear()
        self.entries[key] = entry


@dataclass(frozen=True)
class Answer:
    """A node's replica rows and assignments, and the devices they were made for."""

    generation: int
    devices: tuple[Any, ...]
    heads: list[Any]
    parts: list[Any]
    assignments: list[Assignment]


@dataclass(frozen=True)
class NodeEntry:
    """A node as stored after a report handled in a transaction, under the generation read
    with its credential."""

    name: str
    address: str | None
    problem: str | None
    inventory: str | None
    generation: int


class ReportCache:
    """Per process: credentials, node states, answers and the catalog's sources, each valid
    under one value of the "fleet" generation."""

    def __init__(self) -> None:
        self.nodes: ByGeneration[NodeEntry] = ByGeneration()     # credential hash -> node
        self.answers: ByGeneration[Answer] = ByGeneration()      # node name -> answer
        self.sources: tuple[int | None, list[str], str] = (None, [], "")
        self._generation: tuple[int | None, float, int] = (None, -1e9, 0)
        self._lock = threading.Lock()

    def generation(self, store: Store) -> int | None:
        """The generation as read at most ``GENERATION_TTL_S`` ago (None: unknown)."""
        value, at, moves = self._generation
        if time.monotonic() - at <= GENERATION_TTL_S and moves == store.moves:
            return value
        with self._lock:                       # one reader per process at a time
            value, at, moves = self._generation
            if time.monotonic() - at <= GENERATION_TTL_S and moves == store.moves:
                return value
            moves = store.moves                # this process's own writes: seen at once
            try:
                with store.begin() as conn:
                    value = repo.fleet_generation(conn)
            except StoreError:
                value = None                   # the transaction path says what is wrong
            self._generation = (value, time.monotonic(), moves)
        return value

    def forget(self, names: list[str]) -> None:
        """Nodes whose stored state moved on (another process wrote a newer report, or
        their agent said it stopped): their next report is handled in a transaction."""
        if names:
            gone = set(names)
            for key, entry in list(self.nodes.entries.items()):
                if entry.name in gone:
                    self.nodes.entries.pop(key, None)

    def answer(self, node: str, generation: int | None,
               devices: tuple[Any, ...]) -> Answer | None:
        hit = self.answers.get(node, generation)
        return hit if hit is not None and hit.devices == devices else None

    def catalog_sources(self, conn: Any, generation: int | None) -> tuple[list[str], str]:
        """The catalog's sources and their hash (agents look for these in their weights
        directories), re-read when the generation has moved."""
        cached, sources, digest = self.sources
        if generation is None or cached != generation:
            sources = repo.model_sources(conn)
            digest = hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16]
            self.sources = (generation, sources, digest)
        return sources, digest

    def cached_sources(self, generation: int) -> tuple[list[str], str] | None:
        cached, sources, digest = self.sources
        return (sources, digest) if cached == generation else None


class Heartbeats:
    """A steady node's refreshed last report time and devices, written in batches.

    Unless :meth:`start` ran (gunicorn workers: control/serve.py), each is written at once.
    A batch never moves a node's last report backwards, nor revives a node whose agent said
    it stopped (``repo.record_heartbeats``); a report written in a transaction drops the
    node's pending heartbeat."""

    def __init__(self, store_of: Callable[[], Store], stale: Callable[[list[str]], None],
                 every_s: float = FLUSH_EVERY_S) -> None:
        self.store_of = store_of
        self.stale = stale                     # told the nodes whose state moved on
        self.every_s = every_s
        self.pending: dict[str, tuple[float, str]] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stopped = threading.Event()
        self._failing = False

    def start(self) -> None:
        self.stopped.clear()
        self.thread = threading.Thread(target=self._run, name="llmgw-heartbeats", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(5)
            self.thread = None
        self.flush()

    def put(self, node: str, at: float, devices: str) -> None:
        if self.thread is None:
            self.stale(self.store_of().write(
                lambda conn: repo.record_heartbeats(conn, [(node, at, devices)])))
            return
        with self.lock:
            self.pending[node] = (at, devices)

    def drop(self, node: str) -> None:
        with self.lock:
            self.pending.pop(node, None)

    def flush(self) -> int:
        with self.lock:
            batch, self.pending = self.pending, {}
        if not batch:
            return 0
        rows = [(node, at, devices) for node, (at, devices) in batch.items()]
        try:
            stale = self.store_of().write(lambda conn: repo.record_heartbeats(conn, rows))
        except StoreError as exc:
            with self.lock:                    # keep them, unless newer ones came meanwhile
                for node, value in batch.items():
                    self.pending.setdefault(node, value)
            if not self._failing:
                log.warning("writing %d nodes' last reports failed, retrying: %s",
                            len(rows), exc)
            self._failing = True
            return 0
        self._failing = False
        if stale:
            self.stale(stale)
        return len(rows)

    def _run(self) -> None:
        while not self.stopped.wait(self.every_s):
            try:
                self.flush()
            except Exception:                  # never let the writer thread die
                log.exception("writing nodes' last reports failed unexpectedly")
