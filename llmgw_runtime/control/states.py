"""Pure decisions of the reconcile loop: what each model wants, what state it is in, and
when a failed start may be retried. No I/O, no clock: ``now`` is passed in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api.states import ReplicaState
from ..catalog.scale import active_floor, replica_range

PARK_AFTER = 5                 # start failures in a row
# A replica on its way to ready: a start of its model runs.
STARTING = (ReplicaState.PENDING, ReplicaState.FETCHING, ReplicaState.STARTING)
BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 300.0


@dataclass(frozen=True)
class ModelState:
    name: str
    state: str                 # ready, starting, activating, idle, parked, unplaceable, stopped
    reason: str | None
    ready: int
    wanted: int


def backoff_s(consecutive_failures: int, base_s: float = BACKOFF_BASE_S,
              cap_s: float = BACKOFF_CAP_S) -> float:
    """How long to wait before the next start after ``consecutive_failures`` in a row:
    doubling from ``base_s``, at most ``cap_s``."""
    if consecutive_failures <= 0:
        return 0.0
    return min(cap_s, base_s * 2 ** (consecutive_failures - 1))


def in_backoff(consecutive_failures: int, last_failure_at: float | None, now: float,
               base_s: float = BACKOFF_BASE_S, cap_s: float = BACKOFF_CAP_S) -> bool:
    if last_failure_at is None:
        return False
    return now < last_failure_at + backoff_s(consecutive_failures, base_s, cap_s)


def wanted_replicas(model: Any, replicas: list[Any], now: float) -> int:
    """Replicas ``model`` (a models row) should have now. An on-demand model has none
    until activated, and goes back to none when every replica was idle long enough. A
    model with a replica range runs the autoscaler's target (control/autoscale.py) within
    it, its floor until there is one."""
    if model.parked or getattr(model, "deleted_at", None) is not None:
        return 0
    if model.on_demand and model.activated_at is None:
        return 0
    floor = active_floor(model.replicas, bool(model.on_demand))
    target = getattr(model, "scale_target", None)
    if target is None:
        return floor
    ceiling = replica_range(model.replicas, getattr(model, "replicas_max", None),
                            bool(model.on_demand))[1]
    return max(floor, min(int(target), ceiling))


def idle_expired(model: Any, replicas: list[Any], now: float) -> bool:
    """An activated on-demand model whose replicas nobody used for idle_stop_after."""
    if not model.on_demand or model.activated_at is None or not model.idle_stop_after_s:
        return False
    last = max([model.activated_at] + [r.last_used or 0 for r in replicas]
               + [r.started for r in replicas if r.state != "ready"])
    return now - last >= model.idle_stop_after_s


def model_state(model: Any, replicas: list[Any], now: float) -> ModelState:
    """The one answer to "what is this model doing", used by routes, ctl and the console."""
    live = [r for r in replicas if r.desired]
    # a draining replica serves no new request: it is not counted ready
    ready = sum(1 for r in live if r.state == "ready"
                and getattr(r, "drain_since", None) is None)
    wanted = wanted_replicas(model, live, now)
    if model.parked:
        return ModelState(model.name, "parked", model.last_error or "too many failed starts",
                          ready, 0)
    if ready:
        return ModelState(model.name, "ready", None, ready, wanted)
    if model.placement_reason:
        return ModelState(model.name, "unplaceable", model.placement_reason, 0, wanted)
    # the streak's last error stays the reason while the next start runs, so that the
    # reason does not come and go with each start of a failing model
    streak_error = model.last_error if model.consecutive_failures else None
    if any(r.state in (ReplicaState.PENDING, ReplicaState.STARTING) for r in live):
        return ModelState(model.name, "starting", streak_error, 0, wanted)
    if model.on_demand:
        if model.activated_at is None:
            return ModelState(model.name, "idle", None, 0, 0)
        return ModelState(model.name, "activating", model.last_error, 0, wanted)
    if wanted == 0:
        return ModelState(model.name, "stopped", "replicas is 0 in the catalog", 0, 0)
    return ModelState(model.name, "starting", model.last_error, 0, wanted)


def failing(model: Any, replicas: list[Any], state: ModelState, now: float,
            backoff: tuple[float, float]) -> dict[str, Any] | None:
    """A model whose current start streak failed and that has no ready replica: failed
    starts in a row, the last error, whether a start runs now and else the seconds until
    the next may begin (the status summary says ``failing (3 in a row, next start in
    20 s)``, steadily from one poll to the next). None for a ready, parked, unplaceable,
    idle or stopped model and while no start of the streak failed."""
    if state.state not in ("starting", "activating"):
        return None
    streak = start_streak(model, now, backoff)
    if streak["failures"] < 1:
        return None
    starting = any(r.desired and r.state in STARTING for r in replicas)
    return {"failures": streak["failures"], "last_error": streak["last_error"],
            "starting": starting,
            "next_start_in_s": None if starting else streak["retry_after_s"]}


def start_streak(model: Any, now: float, backoff: tuple[float, float]
                 ) -> dict[str, Any]:
    """The model's current start streak as routers need it: failed starts in a row, the
    last error and the seconds until the next start may begin. Nothing while no start of
    the streak failed. An on-demand model's failures count only when they happened after
    it was last activated: a streak that ended when the model went idle is no reason to
    refuse the request that wakes it up."""
    failures = int(model.consecutive_failures or 0)
    if failures < 1 or (model.on_demand and (
            model.activated_at is None or model.last_failure_at is None
            or model.last_failure_at < model.activated_at)):
        return {"failures": 0, "last_error": None, "retry_after_s": None}
    wait = 0.0
    if model.last_failure_at is not None:
        wait = max(0.0, model.last_failure_at + backoff_s(failures, *backoff) - now)
    return {"failures": failures, "last_error": model.last_error,
            "retry_after_s": round(wait, 3)}
