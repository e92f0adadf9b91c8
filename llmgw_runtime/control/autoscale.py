"""Autoscaling: how many replicas a model with a range (``replicas: {min, max}``) runs now.

Part of the fleet layer, pure: no I/O, no clock (``now`` is the store's, passed in). Each
reconcile pass (control/decide.py) gives every scaled model's row, its replicas and the
load the routers reported (control/capacity.py ``load_of``) to :func:`decide_model`, which
moves its target one step at a time between its floor and its max:

- **up** when requests wait longer than ``wait_target_s`` (the longest of the routers'
  p90 of finished waits and oldest still waiting), or are refused for capacity, without
  a break for ``up_after_s``, no replica of the model is still starting, and the last step
  is ``cooldown_s`` ago;
- **down** when nothing waits and under ``busy_below`` of the ready replicas' slots is
  busy (each router's peak, summed) for ``down_after_s``, after the cooldown too;
- never beyond the max (said once per burst: a break in the signal shorter than
  ``cooldown_s`` belongs to the same burst) nor below the floor (the min; for an
  on-demand model 1 while it is wanted: going to 0 is ``idle_stop_after``'s, as before).

After placement, :func:`unplaceable_step` takes back a step the fleet has no room for:
the target returns to what is placed, the reason is kept and said in one event, and the
cooldown passes before the next try, so an unplaceable extra is not retried every tick and
never makes the model "unplaceable" (it still runs what it had). Every step is an event
that says why ("queue wait 4.1 s > 2 s for 60 s: 2 -> 3"). docs/autoscaling.md.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from ..api.catalog import Autoscale
from ..api.states import ReplicaState
from ..catalog.scale import active_floor, replica_range
from ..engines.slots import slots_of
from ..status.summary import waiting_for_home
from ..store.models import spec_of
from .capacity import LOAD_WINDOW_S, Load, load_of

EVENT = "autoscale"
_AT_MAX = "at-max"


@dataclass(frozen=True)
class ScaleState:
    """What the reconciler remembers between passes (``models.scale_state``)."""

    high_since: float | None = None    # since when requests wait too long, unbroken
    low_since: float | None = None     # since when the slots are mostly idle, unbroken
    last_at: float | None = None       # the last step (or a step the fleet had no room for)
    blocked: str | None = None         # why the last step up could not be placed
    said: str | None = None            # a hold already said in an event (not repeated)
    calm_since: float | None = None    # since when a said hold's signal is gone, unbroken

    @classmethod
    def of(cls, text: str | None) -> ScaleState:
        """From the stored JSON; a missing or unreadable one is a fresh start."""
        try:
            raw = json.loads(text) if text else {}
        except ValueError:
            raw = {}
        if not isinstance(raw, dict):
            raw = {}
        known = {k: v for k, v in raw.items() if k in cls.__dataclass_fields__}
        return cls(**known)

    def to_text(self) -> str | None:
        values = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(values, sort_keys=True) if values else None


@dataclass(frozen=True)
class Step:
    """One pass's answer for one model: its target, what to remember, the event (or None)."""

    target: int | None
    state: ScaleState
    event: str | None = None


def clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def why_over(load: Load, settings: Autoscale) -> str | None:
    """Why the model needs more replicas now, in operator words; None when it does not."""
    if load.wait_s > settings.wait_target_s:
        return f"queue wait {load.wait_s:.1f} s > {settings.wait_target_s:g} s"
    if load.rejected:
        return (f"{load.rejected} request{'s' if load.rejected != 1 else ''} refused for "
                f"capacity in {LOAD_WINDOW_S:g} s")
    return None


def why_low(load: Load, slots: int | None, settings: Autoscale) -> str | None:
    """Why the model could do with fewer replicas now; None when it could not. ``slots``:
    those of its ready replicas (None: unknown, then only "nothing in flight" is low)."""
    if load.waiting or load.rejected or load.wait_s > settings.wait_target_s:
        return None
    if slots is None:
        return "no request in flight" if not load.busy else None
    if slots <= 0:
        return None
    share = load.busy / slots
    if share >= settings.busy_below:
        return None
    return (f"busy {load.busy} of {slots} slots ({share:.0%}) < {settings.busy_below:.0%}, "
            "nothing waiting")


def step(settings: Autoscale, floor: int, ceiling: int, target: int | None,
         state: ScaleState, load: Load, slots: int | None, starting: int,
         now: float) -> Step:
    """One pass for a wanted model whose replicas may move between ``floor`` and
    ``ceiling``: its stored ``target`` (None: the floor) and ``state``, the routers'
    ``load``, the ``slots`` of its ready replicas, how many of its replicas are
    ``starting``; returns the new target, state and the event of a step."""
    current = clamp(floor if target is None else target, floor, ceiling)
    event = None
    if target is not None and target != current:
        event = f"the catalog keeps {floor} to {ceiling} replicas now: {target} -> {current}"
    over = why_over(load, settings)
    low = None if over else why_low(load, slots, settings)
    high_since = (now if state.high_since is None else state.high_since) if over else None
    low_since = (now if state.low_since is None else state.low_since) if low else None
    new = replace(state, high_since=high_since, low_since=low_since,
                  **_said(state, bool(over), now, settings.cooldown_s))
    cooled = state.last_at is None or now - state.last_at >= settings.cooldown_s
    if over and high_since is not None and now - high_since >= settings.up_after_s:
        held = f"{over} for {now - high_since:.0f} s"
        if current >= ceiling:
            if state.said != _AT_MAX:
                return Step(current, replace(new, said=_AT_MAX),
                            f"{held}, but it runs its max of {ceiling} replicas; raise "
                            "replicas.max (or slots) to serve more")
        elif not starting and cooled:
            return Step(current + 1, replace(new, high_since=now, last_at=now,
                                             blocked=None, said=None),
                        f"{held}: {current} -> {current + 1}")
    elif low and low_since is not None and now - low_since >= settings.down_after_s \
            and current > floor and cooled:
        return Step(current - 1, replace(new, low_since=now, last_at=now, blocked=None),
                    f"{low} for {now - low_since:.0f} s: {current} -> {current - 1}")
    return Step(current, new, event)


def _said(state: ScaleState, over: bool, now: float, cooldown_s: float) -> dict[str, Any]:
    """A hold said once per burst: it is forgotten only once its signal has been gone for
    ``cooldown_s``; a shorter break (one pass under the target, a router's report late) is
    the same burst, not a new one to say again."""
    if over or state.said is None:
        return {"said": state.said if over else None, "calm_since": None}
    calm_since = now if state.calm_since is None else state.calm_since
    if now - calm_since >= cooldown_s:
        return {"said": None, "calm_since": None}
    return {"said": state.said, "calm_since": calm_since}


def unplaceable_step(target: int, placed: int, floor: int, reason: str | None,
                     state: ScaleState, now: float, cooldown_s: float) -> Step | None:
    """After placement: a target above what could be placed, with the floor placed, is a
    step the fleet has no room for. The target goes back to ``placed``, the reason is kept
    and said, and the cooldown passes before the next try. None when that is not so."""
    if reason is None or placed < floor or target <= placed:
        return None
    return Step(placed, replace(state, blocked=reason, last_at=now),
                f"cannot add a replica ({placed} -> {target}): {reason}; staying at "
                f"{placed}, trying again in {cooldown_s:g} s if requests still wait")


# -- the shell's side: a models row in, the step out ---------------------------------------


@dataclass(frozen=True)
class Scaled:
    """What a models row says of its scaling (None from :func:`scaled` when it has none)."""

    settings: Autoscale
    floor: int
    ceiling: int
    minimum: int          # as the operator reads it (an on-demand model's is 0)
    wanted: bool          # not parked, and an on-demand model is activated


def scaled(row: Any) -> Scaled | None:
    """The scaling of a models row (a row or anything with its fields); None when its
    replicas are fixed."""
    spec = spec_of(row)
    settings = spec.autoscale
    if settings is None:
        return None
    on_demand = spec.on_demand
    floor = active_floor(spec.replicas, on_demand)
    low, high = replica_range(spec.replicas, spec.replicas_max, on_demand)
    if high <= floor:
        return None
    wanted = not row.parked and (not on_demand or row.activated_at is not None)
    return Scaled(settings, floor, high, low, wanted)


def ready_slots(row: Any, replicas: list[Any]) -> int | None:
    """Slots of the model's ready replicas (None: the engine's slots are unknown)."""
    per = slots_of(spec_of(row))
    ready = sum(1 for r in replicas if r.desired and r.state == ReplicaState.READY)
    return None if per is None else per * ready


def decide_model(row: Any, replicas: list[Any], now: float) -> Step | None:
    """The pass's step for one model (its row and live replicas); None when it is not
    scaled and remembers nothing. A model no longer wanted (parked, or an on-demand model
    stopped when idle) forgets its target, so that it starts again from its floor."""
    scale = scaled(row)
    if scale is None or not scale.wanted:
        if getattr(row, "scale_target", None) is None and not getattr(row, "scale_state",
                                                                        None):
            return None
        return Step(None, ScaleState())
    starting = sum(1 for r in replicas if r.desired and r.state != ReplicaState.READY)
    return step(scale.settings, scale.floor, scale.ceiling, getattr(row, "scale_target", None),
                ScaleState.of(getattr(row, "scale_state", None)),
                load_of(_json(getattr(row, "load", None)), now),
                ready_slots(row, replicas), starting, now)


def _json(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def view(row: Any, replicas: list[Any], now: float) -> dict[str, Any] | None:
    """What ``ctl status``, the console and ``/metrics`` show of a scaled model: current
    (ready) / target / min / max, the signal, the state of its windows and its last hold.
    None for a model with fixed replicas."""
    scale = scaled(row)
    if scale is None:
        return None
    state = ScaleState.of(getattr(row, "scale_state", None))
    load = load_of(_json(getattr(row, "load", None)), now)
    slots = ready_slots(row, replicas)
    ready = sum(1 for r in replicas if r.desired and r.state == ReplicaState.READY)
    stored = getattr(row, "scale_target", None)
    target = (clamp(scale.floor if stored is None else stored, scale.floor, scale.ceiling)
              if scale.wanted else 0)
    signal = {"waiting": load.waiting, "busy": load.busy, "slots": slots,
              "wait_s": round(load.wait_s, 3), "rejected": load.rejected,
              "routers": load.routers}
    return {"current": ready, "target": target, "min": scale.minimum, "max": scale.ceiling,
            "signal": signal, "settings": scale.settings.to_dict(),
            "up_for_s": _for(state.high_since, now), "down_for_s": _for(state.low_since, now),
            "blocked": state.blocked,
            "note": note(signal, scale.settings, waiting_for_home(
                load.waiting, load.busy, slots, spec_of(row).model_dump()))}


def _for(since: float | None, now: float) -> float | None:
    return None if since is None else round(max(0.0, now - since), 1)


def note(signal: dict[str, Any], settings: Autoscale, why: str | None = None) -> str:
    """``wait 4.1 s (target 2 s), 3/4 slots busy, 5 waiting``: the signal in one line;
    ``why`` (``status.summary.waiting_for_home``) in place of ``5 waiting`` when slots are
    free."""
    slots = signal["slots"]
    busy = (f"{signal['busy']}/{slots} slots busy" if slots is not None
            else f"{signal['busy']} busy")
    text = f"wait {signal['wait_s']:.1f} s (target {settings.wait_target_s:g} s), {busy}"
    if signal["waiting"]:
        text += f", {why or str(signal['waiting']) + ' waiting'}"
    if signal["rejected"]:
        text += f", {signal['rejected']} refused"
    return text
