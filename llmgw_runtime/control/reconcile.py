"""The reconcile loop. Every control instance runs one; only the holder of the leader lease
acts, and every write it makes re-checks the lease in the same transaction (fencing), so two
instances never both act."""

from __future__ import annotations

import logging
import threading
import uuid
from collections import defaultdict
from typing import Any

from sqlalchemy.engine import Connection

from ..api.states import ReplicaState
from ..errors import StoreError
from ..placement import place
from ..store import Store, repo
from . import snapshot
from .config import ControlConfig
from .states import PARK_AFTER, backoff_s, idle_expired

log = logging.getLogger(__name__)

LEASE = "reconciler"


class Reconciler:
    def __init__(self, store: Store, config: ControlConfig, holder: str | None = None) -> None:
        self.store = store
        self.config = config
        self.holder = holder or f"{config.holder}:{uuid.uuid4().hex[:6]}"
        self.is_leader = False
        self._stop = threading.Event()
        self._last_error: str | None = None

    # ------------------------------------------------------------ one cycle

    def run_cycle(self) -> bool:
        """Try to lead; when leading, reconcile once. Returns whether this instance led."""
        with self.store.begin() as conn:
            now = self.store.now(conn)
            leader = repo.try_lease(conn, LEASE, self.holder, now, self.config.lease_ttl_s)
        if leader != self.is_leader:
            log.info("%s %s leadership", self.holder, "took" if leader else "lost")
            self.is_leader = leader
        if not leader:
            return False
        with self.store.begin() as conn:
            now = self.store.now(conn)
            if not repo.holds_lease(conn, LEASE, self.holder, now, lock=True):
                self.is_leader = False
                return False
            reconcile(conn, now, self.config)
        return True

    def release(self) -> None:
        try:
            with self.store.begin() as conn:
                repo.release_lease(conn, LEASE, self.holder)
        except StoreError:
            pass
        self.is_leader = False

    # ------------------------------------------------------------ the loop

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_cycle()
                self._last_error = None
            except StoreError as exc:
                if str(exc) != self._last_error:
                    log.warning("reconcile cycle failed: %s", exc)
                    self._last_error = str(exc)
                self.is_leader = False
            except Exception:
                log.exception("reconcile cycle failed unexpectedly; continuing")
                self.is_leader = False
            self._stop.wait(self.config.reconcile_interval_s)
        self.release()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run_forever, name="llmgw-reconcile", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()


def _record_failure(conn: Connection, model: Any, message: str, now: float,
                    config: ControlConfig) -> None:
    failures = model.consecutive_failures + 1
    values: dict[str, Any] = {"consecutive_failures": failures, "last_error": message,
                              "last_failure_at": now}
    repo.add_event(conn, now, "failure", model.name,
                   f"start failure {failures} in a row: {message}")
    if failures >= PARK_AFTER and not model.parked:
        values["parked"] = 1
        repo.add_event(conn, now, "park", model.name,
                       f"parked after {failures} failed starts in a row; fix the cause, then "
                       f"run `llmgw ctl retry {model.name}` or change its definition. "
                       f"Last error: {message}")
    else:
        repo.add_event(conn, now, "backoff", model.name,
                       f"next start in {backoff_s(failures, *config.backoff):.0f} s")
    repo.update_model(conn, model.name, **values)


def _part_failure(parts: list[Any]) -> str | None:
    for part in parts:
        if part.state == "failed":
            return (f"part {part.rank} on {part.node} failed: "
                    f"{part.last_error or 'the engine stopped'}")
    return None


def _rendezvous_port(conn: Connection, config: ControlConfig, nodes: set[str],
                     taken: set[int]) -> int | None:
    used = repo.used_rendezvous_ports(conn, nodes) | taken
    return next((p for p in config.rendezvous_range if p not in used), None)


def reconcile(conn: Connection, now: float, config: ControlConfig) -> None:
    """One pass of the leader: account for failures, then place and stop replicas."""
    models = {m.name: m for m in repo.list_models(conn)}
    nodes = {n.name: n for n in repo.list_nodes(conn)}
    parts = repo.parts_by_replica(conn)
    by_model: dict[str, list[Any]] = defaultdict(list)
    for rep in repo.list_replicas(conn):
        node = nodes.get(rep.node)
        node_dead = node is None or node.last_report is None or \
            now - node.last_report > config.node_timeout_s
        model = models.get(rep.model)
        if not rep.desired:
            if node_dead:
                repo.delete_replica(conn, rep.id)   # nobody is left to stop it
            continue
        part_failure = _part_failure(parts.get(rep.id, []))
        if rep.state == "failed" or part_failure or (
                rep.state in (ReplicaState.PENDING, ReplicaState.STARTING)
                and now - rep.started > config.start_timeout_s):
            message = part_failure or rep.last_error or (
                f"not ready within {config.start_timeout_s:.0f} s of being placed on "
                f"{rep.node}")
            if model is not None:
                _record_failure(conn, model, message, now, config)
                models[rep.model] = repo.get_model(conn, rep.model)
            repo.delete_replica(conn, rep.id)
            continue
        if rep.state == "ready" and model is not None and model.consecutive_failures:
            repo.update_model(conn, model.name, consecutive_failures=0, last_failure_at=None)
            models[rep.model] = repo.get_model(conn, rep.model)
        by_model[rep.model].append(rep)
    for model in list(models.values()):
        if idle_expired(model, by_model.get(model.name, []), now):
            repo.update_model(conn, model.name, activated_at=None)
            repo.add_event(conn, now, "idle-stop", model.name,
                           f"nobody used it for {model.idle_stop_after_s:.0f} s; stopping")
            models[model.name] = repo.get_model(conn, model.name)

    live = [r for reps in by_model.values() for r in reps]
    unusable: dict[str, str] = {}
    snap = snapshot.build(list(models.values()), list(nodes.values()), live, now,
                          config.node_timeout_s, parts=parts,
                          replace_after_s=config.replace_after_s, backoff=config.backoff,
                          unusable=unusable)
    for name, problem in unusable.items():
        if nodes[name].problem != problem:
            repo.set_node_problem(conn, name, problem)
            repo.add_event(conn, now, "node", name, f"node {name} is left out of placement: "
                           f"{problem}")
    plan = place(snap)
    taken_ports: set[int] = set()
    for start in plan.starts:
        replica_id = "r-" + uuid.uuid4().hex[:12]
        port = None
        if start.parts:
            port = _rendezvous_port(conn, config, {start.node, *(p.node for p in start.parts)},
                                    taken_ports)
            if port is None:
                repo.add_event(conn, now, "unplaceable", start.model,
                               f"every rendezvous port ({config.rendezvous_ports}) is in use "
                               "on these nodes; widen LLMGW_RENDEZVOUS_PORTS")
                continue
            taken_ports.add(port)
        repo.add_replica(conn, replica_id, start.model, start.node, start.devices, now,
                         parts=tuple((p.rank, p.node, p.devices) for p in start.parts),
                         rendezvous_port=port)
        where = "; ".join(f"{n} device(s) {','.join(str(d) for d in devs)}"
                          for n, devs in [(start.node, start.devices),
                                          *((p.node, p.devices) for p in start.parts)])
        repo.add_event(conn, now, "place", start.model,
                       f"replica {replica_id} placed on {where}"
                       + (f" ({start.why})" if start.why else ""))
    for replica_id in plan.stops:
        repo.update_replica(conn, replica_id, desired=0, state="stopping", updated=now)
        repo.add_event(conn, now, "stop", replica_id,
                       plan.stop_reasons.get(replica_id, "no longer wanted; stopping"))
    for model in models.values():
        reason = plan.unplaceable.get(model.name)
        if reason != model.placement_reason:
            repo.update_model(conn, model.name, placement_reason=reason)
            if reason:
                repo.add_event(conn, now, "unplaceable", model.name, reason)
        _warn_placement(model.name, reason, now, config.placement_warning_every_s)


_warned: dict[str, tuple[str, float]] = {}


def _warn_placement(model: str, reason: str | None, now: float, every_s: float) -> None:
    """Log a model that cannot be placed when its reason changes, else at most every
    ``every_s`` (not every tick: a cluster once logged "no placement" 250 times)."""
    if reason is None:
        _warned.pop(model, None)
        return
    last = _warned.get(model)
    if last is None or last[0] != reason or now - last[1] >= every_s:
        log.warning("model %s cannot be placed: %s", model, reason)
        _warned[model] = (reason, now)
