"""The fleet's rules as one pure function: ``decide(fleet, now, settings)`` -> the changes.

No I/O and no clock: the fleet (what the store holds) and ``now`` (the store's clock) are
passed in, and new replica ids come from ``settings.new_id``. ``control/fleet.py`` reads the
fleet, calls this, and writes the changes; the reconciler process and the views only call
that layer. Each rule is its own small function, table-tested in tests/control/test_decide.py:
failures and parking, resetting a streak once a replica is ready, idle stops of on-demand
models, autoscaling (``control/autoscale.py``), placement (``placement.place``), and
rendezvous ports of multi-node replicas.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ..api.states import ReplicaState
from ..store.models import spec_of
from ..store.repo import NewReplica
from . import autoscale, drain, planmemo, rollout, snapshot, steps
from .drain import SETTLE_S, STALE_S
from .states import PARK_AFTER, backoff_s, idle_expired


@dataclass(frozen=True)
class Settings:
    node_timeout_s: float = 30.0
    replace_after_s: float = 120.0
    start_timeout_s: float = 180.0
    backoff: tuple[float, float] = (5.0, 300.0)
    park_after: int = PARK_AFTER
    rendezvous_ports: range = range(29500, 30000)
    drain_settle_s: float = SETTLE_S
    drain_stale_s: float = STALE_S
    new_id: Callable[[], str] = field(default=lambda: "r-" + uuid.uuid4().hex[:12])

    @classmethod
    def of(cls, config: Any) -> Settings:
        """The settings of a ``ControlConfig``."""
        return cls(node_timeout_s=config.node_timeout_s,
                   replace_after_s=config.replace_after_s,
                   start_timeout_s=config.start_timeout_s, backoff=config.backoff,
                   rendezvous_ports=config.rendezvous_range)


@dataclass(frozen=True)
class Fleet:
    """What the store holds, read once: rows by name, replicas, worker parts by replica."""

    models: dict[str, Any]
    nodes: dict[str, Any]
    replicas: list[Any]
    parts: dict[str, list[Any]]
    # from the leader's fleet in memory (control/incremental.py): (the serial of the fleet
    # it handed out before, this one's, the nodes whose records changed between them; the
    # others are the same objects, unchanged); None: not known
    nodes_since: tuple[int, int, frozenset[str]] | None = None


Start = NewReplica     # a replica the pass starts: the row it writes (store/repo.py)


@dataclass
class Changes:
    """What one pass changes, in the order it is to be written."""

    delete_replicas: list[str] = field(default_factory=list)
    model_updates: dict[str, dict[str, Any]] = field(default_factory=dict)
    node_problems: dict[str, str | None] = field(default_factory=dict)
    starts: list[Start] = field(default_factory=list)
    stops: list[tuple[str, str]] = field(default_factory=list)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    unplaceable: dict[str, str | None] = field(default_factory=dict)   # every model's reason
    drains: list[tuple[str, str, float]] = field(default_factory=list)  # id, reason, timeout
    undrains: list[str] = field(default_factory=list)
    rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)  # rollout_state keys
    cuts: dict[str, int] = field(default_factory=dict)       # requests cut, by model
    delete_models: list[str] = field(default_factory=list)   # deleted, no replica left
    nodes_drained: list[str] = field(default_factory=list)

    def update_model(self, name: str, **values: Any) -> None:
        self.model_updates.setdefault(name, {}).update(values)

    def roll(self, model: Any, **keys: Any) -> None:
        """Set ``keys`` of the model's rollout state (None drops one), in the row read
        (so the rest of the pass sees them) and in what is written."""
        self.rollouts.setdefault(model.name, {}).update(keys)
        state = {**rollout.parse_state(getattr(model, "rollout_state", None)), **keys}
        model.rollout_state = rollout.state_text(state)


# ------------------------------------------------------------------ the rules


def failure_of(replica: Any, parts: list[Any], now: float, start_timeout_s: float,
               ) -> str | None:
    """Why a wanted replica counts as a failed start now, or None: it failed, one of its
    parts failed, or it was not ready within ``start_timeout_s`` of being placed."""
    for part in parts:
        if part.state == ReplicaState.FAILED:
            return (f"part {part.rank} on {part.node} failed: "
                    f"{part.last_error or 'the engine stopped'}")
    if replica.state == ReplicaState.FAILED:
        return replica.last_error or f"not ready within {start_timeout_s:.0f} s of being " \
            f"placed on {replica.node}"
    if replica.state in (ReplicaState.PENDING, ReplicaState.STARTING) \
            and now - replica.started > start_timeout_s:
        return replica.last_error or (f"not ready within {start_timeout_s:.0f} s of being "
                                      f"placed on {replica.node}")
    return None


def record_failure(model: Any, message: str, now: float, backoff: tuple[float, float],
                   park_after: int = PARK_AFTER) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """A failed start of ``model``: the new values of its row and the events (kind,
    message). The ``park_after``-th failure in a row parks it; before that, the next start
    waits the backoff."""
    failures = model.consecutive_failures + 1
    values: dict[str, Any] = {"consecutive_failures": failures, "last_error": message,
                              "last_failure_at": now}
    events = [("failure", f"start failure {failures} in a row: {message}")]
    if failures >= park_after and not model.parked:
        values["parked"] = 1
        events.append(("park", f"parked after {failures} failed starts in a row; fix the "
                               f"cause, then run `llmgw ctl retry {model.name}` or change its "
                               f"definition. Last error: {message}"))
    else:
        events.append(("backoff", f"next start in {backoff_s(failures, *backoff):.0f} s"))
    return values, events


def unpark_values() -> dict[str, Any]:
    """A model's row once its failures are forgotten (a new definition, `ctl retry`)."""
    return {"parked": 0, "consecutive_failures": 0, "last_error": None,
            "last_failure_at": None, "placement_reason": None}


def new_definition(old_hash: str | None, new_hash: str) -> bool:
    """Whether an applied catalog entry is a new definition (it unparks the model)."""
    return old_hash is not None and old_hash != new_hash


def free_port(used: set[int], ports: range) -> int | None:
    return next((p for p in ports if p not in used), None)


# ------------------------------------------------------------------ one pass


def decide(fleet: Fleet, now: float, settings: Settings) -> Changes:
    """Everything one reconcile pass changes, from the fleet as read and ``now``."""
    changes = Changes()
    models = {name: SimpleNamespace(**row._mapping) if hasattr(row, "_mapping")
              else SimpleNamespace(**vars(row)) for name, row in fleet.models.items()}
    pass_ = steps.Pass(fleet, models, now, settings)
    live: list[Any] = []
    held: list[Any] = []                       # draining: they hold their devices
    for rep in fleet.replicas:
        model = models.get(rep.model)
        if not rep.desired:
            if not pass_.heard_node(rep.node):
                changes.delete_replicas.append(rep.id)       # nobody is left to stop it
            continue
        if drain.is_draining(rep):
            held.append(rep)
            continue
        parts = fleet.parts.get(rep.id)
        # a ready replica with no worker parts has not failed (most replicas, every pass)
        message = None if rep.state == ReplicaState.READY and not parts else \
            failure_of(rep, parts or [], now, settings.start_timeout_s)
        if message is not None:
            if model is not None and pass_.rolls_to(model, rep):
                keys, event = rollout.failed(model, rep, message, now)
                changes.roll(model, **keys)
                changes.events.append((rollout.EVENT, model.name, event))
            elif model is not None:
                values, events = record_failure(model, message, now, settings.backoff,
                                                settings.park_after)
                vars(model).update(values)
                changes.update_model(model.name, **values)
                changes.events += [(kind, model.name, text) for kind, text in events]
            changes.delete_replicas.append(rep.id)
            continue
        if rep.state == ReplicaState.READY and model is not None \
                and model.consecutive_failures:
            vars(model).update(consecutive_failures=0, last_failure_at=None)
            changes.update_model(model.name, consecutive_failures=0, last_failure_at=None)
        live.append(rep)
    by_model: dict[str, list[Any]] = {}
    for rep in live:
        by_model.setdefault(rep.model, []).append(rep)
    for model in models.values():
        if steps.deleted(model):
            continue
        if idle_expired(model, by_model.get(model.name, []), now):
            model.activated_at = None
            changes.update_model(model.name, activated_at=None)
            changes.events.append(("idle-stop", model.name,
                                   f"nobody used it for {model.idle_stop_after_s:.0f} s; "
                                   "stopping"))
        _scale(model, by_model.get(model.name, []), now, changes)
    rolls = pass_.rolls(by_model, held, changes)
    held = pass_.drained(held, changes)
    serving = live + pass_.undrained
    plan = _place(fleet, models, serving + held, now, settings, changes, pass_,
                  {name: roll.target for name, roll in rolls.items()})
    pass_.leave(rolls, plan, changes)
    _reasons(models, serving, plan, now, changes)
    pass_.finish(rolls, changes)
    return changes
def _scale(model: Any, replicas: list[Any], now: float, changes: Changes) -> None:
    """The autoscaler's step for one model (a no-op for fixed replicas): its target and
    state into the row (only when they change) and the event."""
    step = autoscale.decide_model(model, replicas, now)
    if step is not None:
        _apply_step(model, step, changes)


def _apply_step(model: Any, step: autoscale.Step, changes: Changes) -> None:
    values = {"scale_target": step.target, "scale_state": step.state.to_text()}
    values = {k: v for k, v in values.items() if getattr(model, k, None) != v}
    if values:
        vars(model).update(values)
        changes.update_model(model.name, **values)
    if step.event:
        changes.events.append((autoscale.EVENT, model.name, step.event))


def _place(fleet: Fleet, models: dict[str, Any], live: list[Any], now: float,
           settings: Settings, changes: Changes, pass_: steps.Pass,
           targets: dict[str, int]) -> Any:
    """Plan the pass (``targets``: replicas each model keeps, control/steps.py) and note
    its starts and stops; returns the plan."""
    unusable: dict[str, str] = {}
    snap = snapshot.build(list(models.values()), list(fleet.nodes.values()), live, now,
                          settings.node_timeout_s, parts=fleet.parts,
                          replace_after_s=settings.replace_after_s,
                          backoff=settings.backoff, unusable=unusable, targets=targets,
                          nodes_since=fleet.nodes_since, leaving=pass_.draining_nodes)
    for name, node in fleet.nodes.items():
        problem = unusable.get(name)
        if node.plan_problem == problem:
            continue
        changes.node_problems[name] = problem
        changes.events.append(("node", name, f"node {name} is left out of placement: "
                                             f"{problem}" if problem else
                               f"node {name} is used for placement again"))
    # placed again only when its inputs moved
    plan = planmemo.PLANS.place(snap, snapshot.NODES.made)
    deleted = set(changes.delete_replicas)
    # the rendezvous ports in use, walked only when a multi-node replica starts
    ports_on = _ports_by_node(fleet, deleted) if any(s.parts for s in plan.starts) else {}
    taken: set[int] = set()
    launches: dict[str, tuple[str, str]] = {}
    for start in plan.starts:
        port = None
        if start.parts:
            nodes = {start.node, *(p.node for p in start.parts)}
            used = set().union(*(ports_on.get(n, set()) for n in nodes)) | taken
            port = free_port(used, settings.rendezvous_ports)
            if port is None:
                changes.events.append((
                    "unplaceable", start.model,
                    f"every rendezvous port ({settings.rendezvous_ports.start}-"
                    f"{settings.rendezvous_ports.stop - 1}) is in use on these nodes; "
                    "widen LLMGW_RENDEZVOUS_PORTS"))
                continue
            taken.add(port)
        if start.model not in launches:
            row = models[start.model]
            launches[start.model] = (row.definition_hash,
                                     rollout.launch_fields(spec_of(row)))
        replica_id = settings.new_id()
        changes.starts.append(Start(replica_id, start.model, start.node, tuple(start.devices),
                                    tuple((p.rank, p.node, tuple(p.devices))
                                          for p in start.parts), port,
                                    *launches[start.model]))
        where = "; ".join(f"{n} device(s) {','.join(str(d) for d in devs)}"
                          for n, devs in [(start.node, start.devices),
                                          *((p.node, p.devices) for p in start.parts)])
        changes.events.append(("place", start.model, f"replica {replica_id} placed on {where}"
                               + (f" ({start.why})" if start.why else "")))
    by_id = {r.id: r for r in live} if plan.stops else {}
    for replica_id in plan.stops:
        why = plan.stop_reasons.get(replica_id, "no longer wanted; stopping")
        rep = by_id[replica_id]
        pass_.stop_or_drain(rep, steps.drain_reason(models.get(rep.model)), why, changes)
    return plan


def _reasons(models: dict[str, Any], live: list[Any], plan: Any, now: float,
             changes: Changes) -> None:
    """Every model's placement reason, written and told when it changes."""
    placed: dict[str, int] | None = None

    def placed_of(name: str) -> int:
        nonlocal placed
        if placed is None:      # only for an autoscaled model that cannot be placed
            placed = _placed([r for r in live if not drain.is_draining(r)], plan)
        return placed.get(name, 0)

    for model in models.values():
        reason = _scale_unplaceable(model, placed_of, plan.unplaceable.get(model.name),
                                    now, changes)
        changes.unplaceable[model.name] = reason
        if reason != model.placement_reason:
            changes.update_model(model.name, placement_reason=reason)
            if reason:
                changes.events.append(("unplaceable", model.name, reason))


def _placed(live: list[Any], plan: Any) -> dict[str, int]:
    """Replicas each model has once the plan is carried out (stops left out)."""
    stopped = set(plan.stops)
    out: dict[str, int] = {}
    for name in [r.model for r in live if r.id not in stopped] + [s.model for s in plan.starts]:
        out[name] = out.get(name, 0) + 1
    return out


def _scale_unplaceable(model: Any, placed: Callable[[str], int], reason: str | None,
                       now: float, changes: Changes) -> str | None:
    """The model's placement reason, or None when it only concerns replicas the
    autoscaler added beyond the floor: that step is taken back (autoscale.py) and the
    model stays what it is, not unplaceable. ``placed``: the replicas a model has once the
    plan is carried out (:func:`_placed`), asked only here."""
    scale = autoscale.scaled(model) if reason else None
    target = getattr(model, "scale_target", None)
    if scale is None or not scale.wanted or target is None:
        return reason
    step = autoscale.unplaceable_step(target, placed(model.name), scale.floor, reason,
                                      autoscale.ScaleState.of(model.scale_state), now,
                                      scale.settings.cooldown_s)
    if step is None:
        return reason
    _apply_step(model, step, changes)
    return None


def _ports_by_node(fleet: Fleet, deleted: set[str]) -> dict[str, set[int]]:
    """Rendezvous ports in use per node (heads and workers), without replicas deleted in
    this pass."""
    out: dict[str, set[int]] = {}
    for rep in fleet.replicas:
        if rep.rendezvous_port is None or rep.id in deleted:
            continue
        for node in {rep.node, *(p.node for p in fleet.parts.get(rep.id, []))}:
            out.setdefault(node, set()).add(rep.rendezvous_port)
    return out
