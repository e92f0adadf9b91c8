"""The reconcile pass's steps for drains, rollouts and node drains (control/decide.py
calls them in order; the rules are control/drain.py's and control/rollout.py's).

In one pass: a canary over its error budget is rolled back; each model's replicas are
split into old, new and going (on a draining node) and the planner is given its target
(``rolls``); draining replicas its model wants again serve again, the others stop once
drained or timed out (``drained``); after the plan, going and old replicas drain or stop
(``leave``); last, finished rollouts, node drains and deleted models are noted
(``finish``). Pure: the fleet as read, ``now`` and the changes so far.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ..api.catalog import ModelSpec, Rollout
from ..api.states import ReplicaState
from ..fleetvocab import heard_from
from ..placement import Plan
from ..store.models import row_to_spec, spec_to_row
from . import drain, rollout
from .states import wanted_replicas


def deleted(model: Any) -> bool:
    """Deleted from the catalog; its replicas drain, then the row goes."""
    return getattr(model, "deleted_at", None) is not None


def drain_reason(model: Any | None) -> str:
    """Why a ready replica the planner stops drains."""
    if model is None or deleted(model):
        return drain.DELETED
    if model.parked:
        return drain.PARKED
    if model.on_demand and model.activated_at is None:
        return drain.IDLE
    return drain.SCALE_DOWN


def _row(rep: Any, **values: Any) -> Any:
    """A copy of a replica's row with ``values`` changed."""
    fields = dict(rep._mapping) if hasattr(rep, "_mapping") else dict(vars(rep))
    return SimpleNamespace(**{**fields, **values})


@dataclass
class Roll:
    """One model in this pass: what it wants, how it rolls, what the planner keeps."""

    wanted: int
    mode: str
    parts: rollout.Split
    target: int
    settings: Rollout


_NONE_GOING: frozenset[str] = frozenset()


class Pass:
    def __init__(self, fleet: Any, models: dict[str, Any], now: float, settings: Any) -> None:
        self.fleet, self.models, self.now, self.settings = fleet, models, now, settings
        self.by_id = {r.id: r for r in fleet.replicas}
        self.draining_nodes = drain.draining_nodes(fleet.nodes.values())
        self.forced_nodes = {n for n in self.draining_nodes
                             if (drain.node_drain(fleet.nodes[n]) or {}).get("force")}
        self.stopped: set[str] = set()        # drained or stopped in this pass
        self.undrained: list[Any] = []        # draining replicas that serve again, as such

    @functools.cached_property
    def old_serving(self) -> dict[str, bool]:
        """The models with a replica of an older definition serving, as read: made at its
        first use (a replica's failed start, in decide's first loop, before the pass
        changes any model's definition), not every pass."""
        old: dict[str, bool] = {}
        for rep in self.fleet.replicas:
            model = self.models.get(rep.model)
            if model is not None and rep.desired and rep.state != ReplicaState.FAILED \
                    and not drain.is_draining(rep) and rollout.is_old(rep, model.definition_hash):
                old[rep.model] = True
        return old

    @functools.cached_property
    def wanted_by_model(self) -> dict[str, list[Any]]:
        """The wanted replicas as read, by model: made at its first use (a deleted model,
        a rollout that may be done, a draining node), not every pass."""
        wanted: dict[str, list[Any]] = {}
        for rep in self.fleet.replicas:
            if rep.desired:
                wanted.setdefault(rep.model, []).append(rep)
        return wanted

    # ------------------------------------------------------------ replicas

    def nodes_of(self, rep: Any) -> set[str]:
        return drain.replica_nodes(rep, self.fleet.parts.get(rep.id, []))

    def heard_node(self, name: str) -> bool:
        node = self.fleet.nodes.get(name)
        return node is not None and heard_from(node.last_report, self.now,
                                               self.settings.node_timeout_s)

    def heard(self, rep: Any) -> bool:
        return all(self.heard_node(n) for n in self.nodes_of(rep))

    def going(self, rep: Any) -> bool:
        return bool(self.draining_nodes) and bool(self.nodes_of(rep) & self.draining_nodes)

    def rolls_to(self, model: Any, rep: Any) -> bool:
        """``rep`` is a new replica of a rollout (its model has old ones serving): its
        failed start stops the rollout instead of counting toward parking."""
        return not rollout.is_old(rep, model.definition_hash) \
            and self.old_serving.get(model.name, False)

    def timeout_of(self, name: str) -> float:
        model = self.models.get(name)
        return float(getattr(model, "drain_timeout_s", None) or drain.DEFAULT_TIMEOUT_S)

    def stop_or_drain(self, rep: Any, reason: str, why: str, changes: Any) -> None:
        """A replica leaves: a ready one on nodes heard from drains for ``reason``; any
        other stops at once (``why``)."""
        if rep.id in self.stopped:
            return
        self.stopped.add(rep.id)
        if rep.state == ReplicaState.READY and self.heard(rep):
            timeout = self.timeout_of(rep.model)
            changes.drains.append((rep.id, reason, timeout))
            changes.events.append((
                "drain", rep.model, f"replica {rep.id} on {rep.node} is draining ({reason}): "
                f"no new requests; it stops once its requests in flight finish, at most "
                f"{timeout:g} s"))
        else:
            changes.stops.append((rep.id, why))
            changes.events.append(("stop", rep.id, why))

    # ------------------------------------------------------------ before the plan

    def rolls(self, by_model: dict[str, list[Any]], held: list[Any], changes: Any
              ) -> dict[str, Roll]:
        """Each model's roll: a canary over its error budget rolled back first; draining
        replicas it wants again serve again (they join ``by_model``)."""
        out = {}
        held_by: dict[str, list[Any]] = {}
        for rep in held:
            held_by.setdefault(rep.model, []).append(rep)
        for model in self.models.values():
            reps = by_model.setdefault(model.name, [])
            self._rollback(model, reps, changes)
            wanted = 0 if deleted(model) else wanted_replicas(model, reps, self.now)
            parts = rollout.split(model.definition_hash, reps,
                                  {r.id for r in reps if self.going(r)}
                                  if self.draining_nodes else _NONE_GOING)
            mode = rollout.NONE if deleted(model) else rollout.mode_of(model, bool(parts.old))
            settings = rollout.settings_of(model)
            target = rollout.target(mode, wanted, settings.max_surge, parts)
            missing = target - len(parts.old) - len(parts.new)
            mine = held_by.get(model.name)
            for rep in (self._undrainable(model, mine)[: max(0, missing)] if mine else ()):
                changes.undrains.append(rep.id)
                changes.events.append(("drain", model.name, f"replica {rep.id} on {rep.node} "
                                       "is wanted again; it serves again"))
                serving = _row(rep, **drain.UNDRAIN_VALUES)
                self.undrained.append(serving)
                parts.new.append(serving)
                reps.append(serving)
            out[model.name] = Roll(wanted, mode, parts, target, settings)
        return out

    def _undrainable(self, model: Any, held: list[Any]) -> list[Any]:
        """Draining replicas of ``model`` (``held``: its own) that may serve again: stopped for idleness, a
        scale-down or a delete, of the current definition, ready, on nodes heard from
        and not draining; the most recent drain first."""
        if deleted(model):
            return []
        found = [r for r in held if r.drain_reason in drain.UNDRAINABLE
                 and not rollout.is_old(r, model.definition_hash)
                 and r.state == ReplicaState.READY and self.heard(r) and not self.going(r)]
        return sorted(found, key=lambda r: (-r.drain_since, r.id))

    def _rollback(self, model: Any, reps: list[Any], changes: Any) -> None:
        """A canary whose error rate is over its budget: the previous definition is
        applied again (its replicas then roll back)."""
        prev_text = getattr(model, "previous_definition", None)
        if deleted(model) or not prev_text:
            return
        has_old = any(rollout.is_old(r, model.definition_hash) for r in reps)
        if rollout.mode_of(model, has_old) != rollout.CANARY:
            return
        state = rollout.parse_state(getattr(model, "rollout_state", None))
        why = rollout.rollback_due(state)
        if why is None:
            return
        try:
            previous = ModelSpec.model_validate(json.loads(prev_text), strict=False)
        except ValueError:
            return
        current = row_to_spec(model)
        back = rollout.undo_spec(current, previous)
        values = {**spec_to_row(back), "previous_definition": current.model_dump_json(
            by_alias=True)}
        old_hash = model.definition_hash
        vars(model).update(values)
        changes.update_model(model.name, **values)
        changes.roll(model, **{**dict.fromkeys(rollout.ROLL_KEYS), "state": rollout.ROLLING,
                               "since": self.now, "hash": back.definition_hash,
                               "from": old_hash, "error": why, "rolled_back": True})
        changes.events.append((rollout.EVENT, model.name, f"rollout of {model.name}: {why} "
                               "to the previous definition"))

    def drained(self, held: list[Any], changes: Any) -> list[Any]:
        """Draining replicas that stop now (drained, timed out, or no longer able to
        serve) stop; returns the others (they keep their devices)."""
        kept = []
        undrained = set(changes.undrains)
        for rep in held:
            if rep.id in undrained:
                continue
            if rep.state == ReplicaState.FAILED:
                changes.delete_replicas.append(rep.id)     # it stopped: nothing to count
                continue
            why = drain.stop_at_once(rep, self.heard(rep))
            verdict = None if why else drain.verdict(rep, self.now,
                                                     self.settings.drain_settle_s,
                                                     self.settings.drain_stale_s)
            if why is None and verdict is None:
                kept.append(rep)
                continue
            message = why or (verdict.message if verdict else "")
            self.stopped.add(rep.id)
            changes.stops.append((rep.id, message))
            changes.events.append(("stop", rep.model, message))
            if verdict is not None and verdict.cut:
                changes.cuts[rep.model] = changes.cuts.get(rep.model, 0) + verdict.cut
        return kept

    # ------------------------------------------------------------ after the plan

    def leave(self, rolls: dict[str, Roll], plan: Plan, changes: Any) -> None:
        """Going and old replicas drain (ready) or stop; a rolling model's reason says
        when a new replica has no room (none while an old one drains to make room)."""
        stops = set(plan.stops)
        for name, roll in rolls.items():
            reason = plan.unplaceable.get(name)
            if not (reason or roll.parts.old or roll.parts.going):
                continue    # nothing leaves, no reason to word: most models, every pass
            forced = bool(reason) and any(self.nodes_of(r) & self.forced_nodes
                                          for r in roll.parts.going)
            parts = rollout.Split(old=[r for r in roll.parts.old if r.id not in stops],
                                  new=[r for r in roll.parts.new if r.id not in stops],
                                  going=roll.parts.going)
            out = rollout.retire(roll.mode, roll.wanted, roll.settings.max_unavailable,
                                 parts, force_going=forced)
            for rid, why in out.drains:
                self.stop_or_drain(self.by_id[rid], why, f"replica {rid} stops ({why})",
                                   changes)
            for rid, why in out.stops:
                if rid not in self.stopped:
                    self.stopped.add(rid)
                    changes.stops.append((rid, why))
                    changes.events.append(("stop", rid, why))
            if reason and self._makes_room(name, roll):
                del plan.unplaceable[name]    # an old one drains for it: not unplaceable
            elif reason and roll.mode != rollout.NONE:
                plan.unplaceable[name] = rollout.no_room(roll.mode, roll.settings,
                                                         len(roll.parts.old), reason)

    def _makes_room(self, name: str, roll: Roll) -> bool:
        """A rollout replacing in place (``max_unavailable``) waits for an old replica
        of the model to drain and free its devices: the new one's missing room is that."""
        if roll.mode not in (rollout.ROLLING, rollout.NONE) \
                or not roll.settings.max_unavailable:
            return False
        model = self.models[name]
        return any(r.model == name and r.desired and rollout.is_old(r, model.definition_hash)
                   and (r.id in self.stopped or getattr(r, "drain_reason", None)
                        == drain.ROLLOUT) for r in self.fleet.replicas)

    def finish(self, rolls: dict[str, Roll], changes: Any) -> None:
        """Rollouts with no old replica left are done; a deleted model with no replica
        left goes; a draining node with nothing left on it is drained."""
        gone = self.stopped | set(changes.delete_replicas)
        for name, model in self.models.items():
            if deleted(model):
                if not self.wanted_by_model.get(name):
                    changes.delete_models.append(name)
                    changes.events.append(("catalog", name, f"model {name} removed: its "
                                            "last replica stopped"))
                continue
            # asked first: nothing rolls for most models, and then their replicas are
            # not walked for an old one
            ended = rollout.done(model, self.now)
            if ended is None or any(
                    rollout.is_old(r, model.definition_hash)
                    for r in self.wanted_by_model.get(name, []) if r.id not in gone):
                continue
            keys, event = ended
            changes.roll(model, **keys)
            changes.events.append((rollout.EVENT, name, event))
        used = set().union(*(self.nodes_of(r) for reps in self.wanted_by_model.values()
                             for r in reps)) if self.draining_nodes else set()
        for name in sorted(self.draining_nodes - used):
            changes.nodes_drained.append(name)
            changes.events.append(("node", name, f"node {name} drained: no replica is left "
                                   f"on it; it stays cordoned until `llmgw ctl nodes "
                                   f"uncordon {name}`"))
