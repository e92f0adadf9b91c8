"""Model rollouts as pure rules (docs/operations.md, "rollouts").

Every replica stores the definition it was placed with (``replicas.definition_hash``); a
replica whose hash is not its model's current one is *old*. While a model has old replicas
it rolls, with Kubernetes' RollingUpdate arithmetic: with ``N`` wanted, ``max_surge`` S and
``max_unavailable`` U, at most ``N + S`` replicas run (new ones are started up to that) and
an old one drains only while ``N - U`` stay ready without it. A canary (``canary_percent``
> 0, not promoted) runs one new replica beside the old ones and drains none of them. A new
replica that fails to start stops the rollout (no more new starts; the old replicas keep
serving); the model is not parked for it. Replicas on a draining node (*going*) get a
replacement first, beyond ``max_surge``, then drain.

The model row's ``rollout_state`` (JSON) holds what the rows do not say: ``state``
(rolling, canary, failed), ``since``, ``hash`` (the definition it rolls to), ``from``,
``promoted``, ``error``, ``versions`` (a canary's requests per version, from the routers)
and ``cut`` (requests cut by drain timeouts, a counter kept across rollouts).

No I/O and no clock. control/decide.py applies it in a pass, control/rollout_ops.py answers
``ctl rollout``, control/routes.py marks a canary's endpoints.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Literal

from ..api.catalog import HASH_FIELDS, ModelSpec, Rollout
from ..api.router import ModelVersions
from ..api.states import ReplicaState
from .drain import NODE_DRAIN, ROLLOUT, SCALE_DOWN, is_draining

Mode = Literal["none", "rolling", "canary", "failed"]
ROLLING: Mode = "rolling"
CANARY: Mode = "canary"
FAILED: Mode = "failed"
NONE: Mode = "none"
DEFAULTS = Rollout.model_validate({})
EVENT = "rollout"
CANARY_MIN_REQUESTS = 20        # the canary's requests before its error rate counts
CANARY_MIN_RATE = 0.05          # ... and the rate it may have whatever the stable one's
VERSION_FIELDS = ("requests", "errors", "tokens", "first_byte_s", "answered")
# The keys of rollout_state that describe one rollout (cleared when it is done).
ROLL_KEYS = ("state", "since", "hash", "from", "promoted", "error", "versions", "failed_at",
             "rolled_back")


# ------------------------------------------------------------------ the row


def parse_state(text: str | None) -> dict[str, Any]:
    """A model row's ``rollout_state`` JSON (unreadable: empty)."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def state_text(state: dict[str, Any]) -> str | None:
    """``rollout_state`` as stored: keys set to None dropped; nothing left: NULL."""
    kept = {k: v for k, v in state.items() if v is not None}
    return json.dumps(kept, sort_keys=True) if kept else None


def settings_of(row: Any) -> Rollout:
    """The model's ``rollout`` settings (NULL: the defaults)."""
    text = getattr(row, "rollout", None)
    return _settings(text) if text else DEFAULTS


@functools.lru_cache(maxsize=4096)
def _settings(text: str) -> Rollout:
    """``rollout`` settings by their JSON (every pass reads every model's; frozen)."""
    try:
        return Rollout.model_validate(json.loads(text), strict=False)
    except ValueError:
        return DEFAULTS


def hash_of(rep: Any) -> str | None:
    return getattr(rep, "definition_hash", None)


def is_old(rep: Any, model_hash: str | None) -> bool:
    """The replica runs another definition than its model's current one (a replica from
    before revision 0015 has none: it runs the current one)."""
    rep_hash = hash_of(rep)
    return rep_hash is not None and model_hash is not None and rep_hash != model_hash


def launch_fields(spec: ModelSpec) -> str:
    """The launch fields an assignment carries, as ``replicas.launch`` stores them (JSON):
    an old replica keeps its own after an agent restart (control/assignments.py)."""
    return json.dumps({"engine": spec.engine, "source": spec.source, "sha256": spec.sha256,
                       "size_bytes": spec.size_bytes, "args": list(spec.args),
                       "profile": spec.profile.to_dict(), "slots": spec.slots},
                      sort_keys=True)


def undo_spec(current: ModelSpec, previous: ModelSpec) -> ModelSpec:
    """The current entry with the previous definition (``ctl rollout undo``, and a canary
    rolled back): only the definition's fields go back; replicas, routing and the rest
    stay as they are now."""
    return current.model_copy(update={n: getattr(previous, n) for n in HASH_FIELDS})


# ------------------------------------------------------------------ one model's pass


@dataclass(frozen=True)
class Split:
    """A model's serving replicas (wanted, not draining, not failed) by definition."""

    old: list[Any] = field(default_factory=list)      # an older definition, staying put
    new: list[Any] = field(default_factory=list)      # the current one, staying put
    going: list[Any] = field(default_factory=list)    # on a draining node, any definition


def split(model_hash: str | None, reps: list[Any], going: AbstractSet[str]) -> Split:
    out = Split()
    for rep in reps:
        (out.going if rep.id in going else out.old if is_old(rep, model_hash)
         else out.new).append(rep)
    return out


def mode_of(row: Any, has_old: bool) -> Mode:
    """none (no old replica), failed (the current definition did not start), canary
    (one new replica holds ``canary_percent`` until promoted), or rolling."""
    if not has_old:
        return NONE
    state = parse_state(getattr(row, "rollout_state", None))
    if state.get("state") == FAILED and state.get("hash") == row.definition_hash:
        return FAILED
    if (settings_of(row).canary_percent and not state.get("promoted")
            and not state.get("rolled_back")):
        return CANARY
    return ROLLING


def target(mode: str, wanted: int, surge: int, parts: Split) -> int:
    """How many replicas the planner keeps for the model beside its going ones: its old
    ones and the new ones it may have now (K8s: at most ``wanted + surge`` in all)."""
    old, new = len(parts.old), len(parts.new)
    if mode == NONE:
        return wanted
    if mode == FAILED:
        more = new
    elif mode == CANARY:
        more = max(new, min(1, wanted))
    else:
        more = max(new, min(wanted, wanted + surge - old))
    return old + more


def _order(rep: Any) -> tuple[bool, float, str]:
    """Not ready first, then the oldest."""
    return (rep.state == ReplicaState.READY, rep.started, rep.id)


@dataclass
class Retire:
    """Replicas leaving now: ready ones drain (id, reason), the others stop (id, why)."""

    drains: list[tuple[str, str]] = field(default_factory=list)
    stops: list[tuple[str, str]] = field(default_factory=list)


def retire(mode: str, wanted: int, unavailable: int, parts: Split, *,
           force_going: bool = False) -> Retire:
    """Which going and old replicas leave in this pass. A going one drains once its model
    keeps ``wanted`` ready without it (at once with ``force_going``: a forced drain whose
    replacement has no room); an old one while ``wanted - unavailable`` stay ready. One
    that is not ready serves nothing: it stops at once. A canary or a failed rollout
    drains old ones only beyond what the model wants (the old replicas keep serving)."""
    out = Retire()
    ready = sum(r.state == ReplicaState.READY for r in parts.old + parts.new + parts.going)
    for rep in sorted(parts.going, key=_order):
        if rep.state != ReplicaState.READY:
            out.stops.append((rep.id, f"replica {rep.id} leaves its draining node; not "
                                      f"ready ({rep.state}), so it stops at once"))
        elif force_going or ready - 1 >= wanted:
            out.drains.append((rep.id, NODE_DRAIN))
            ready -= 1
    if mode == ROLLING:
        for rep in sorted(parts.old, key=_order):
            if rep.state != ReplicaState.READY:
                out.stops.append((rep.id, f"replica {rep.id} runs the old definition and "
                                          f"is not ready ({rep.state}); stopping it at once"))
            elif ready - 1 >= wanted - unavailable:
                out.drains.append((rep.id, ROLLOUT))
                ready -= 1
    elif mode in (CANARY, FAILED):
        for rep in sorted(parts.old, key=_order)[: max(0, len(parts.old) - wanted)]:
            if rep.state == ReplicaState.READY:
                out.drains.append((rep.id, SCALE_DOWN))
            else:
                out.stops.append((rep.id, f"replica {rep.id} is no longer wanted; stopping"))
    return out


def no_room(mode: str, settings: Rollout, old: int, reason: str) -> str:
    """The model's placement reason while it rolls and a new replica has no room."""
    if mode == CANARY:
        return (f"no room to start the canary beside the {old} old replica(s): {reason}")
    if mode == ROLLING and settings.max_unavailable == 0:
        return (f"no room to start a new replica beside the {old} old one(s) (max_surge "
                f"{settings.max_surge}): {reason}; set rollout.max_unavailable: 1 to replace "
                "them in place")
    return reason


# ------------------------------------------------------------------ its state


def started(row: Any, old_hash: str | None, now: float) -> dict[str, Any]:
    """``rollout_state`` keys of a rollout that starts now (a new definition applied
    while replicas run the old one). Going back to the definition the rollout in progress
    came from (``ctl rollout undo``, or that definition applied again) is a roll back: it
    replaces the new replicas, a canary's included, without holding a canary of the old
    version."""
    before = parse_state(getattr(row, "rollout_state", None))
    back = (before.get("state") in (ROLLING, CANARY, FAILED)
            and before.get("from") == row.definition_hash)
    canary = settings_of(row).canary_percent > 0 and not back
    return {"state": CANARY if canary else ROLLING, "since": now, "hash": row.definition_hash,
            "from": old_hash, "promoted": None, "error": None, "versions": None,
            "failed_at": None, "rolled_back": True if back else None}


def failed(row: Any, rep: Any, message: str, now: float) -> tuple[dict[str, Any], str]:
    """The keys and the event of a rollout stopped by a new replica that did not start."""
    event = (f"rollout of {row.name} failed: new replica {rep.id} on {rep.node} did not "
             f"start: {message}; the replicas of the old definition keep serving. Apply "
             f"the old definition again or run `llmgw ctl rollout undo {row.name}`; "
             f"`llmgw ctl retry {row.name}` tries the new one again")
    return ({"state": FAILED, "error": message, "hash": row.definition_hash,
             "failed_at": now}, event)


def done(row: Any, now: float) -> tuple[dict[str, Any], str] | None:
    """The keys and the event once no replica of an older definition is left; None while
    the state says nothing is rolling."""
    state = parse_state(getattr(row, "rollout_state", None))
    if state.get("state") not in (ROLLING, CANARY, FAILED):
        return None
    since = state.get("since")
    took = f" in {now - since:.0f} s" if isinstance(since, int | float) else ""
    if state.get("state") == FAILED:
        event = (f"rollout of {row.name} ended: no replica of the old definition is left; "
                 "the new definition starts as any other")
    else:
        event = f"rollout of {row.name} done{took}"
    clear: dict[str, Any] = dict.fromkeys(ROLL_KEYS)
    if state.get("rolled_back"):
        clear.update(error=state.get("error"))
    return clear, event


def add_versions(state: dict[str, Any], counts: ModelVersions) -> dict[str, Any]:
    """``state`` with a router worker's per-version counts added (a canary's)."""
    versions = dict(state.get("versions") or {})
    for name in ("stable", "canary"):
        got = getattr(counts, name)
        mine = dict(versions.get(name) or {})
        for key in VERSION_FIELDS:
            mine[key] = (mine.get(key) or 0) + getattr(got, key)
        versions[name] = mine
    return {**state, "versions": versions}


def tally(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each version's requests, errors, tokens and mean first-byte time (api/admin.py
    ``VersionTally``)."""
    out = {}
    for name, got in (state.get("versions") or {}).items():
        if not isinstance(got, dict):
            continue
        answered = got.get("answered") or 0
        out[name] = {"requests": int(got.get("requests") or 0),
                     "errors": int(got.get("errors") or 0),
                     "tokens": int(got.get("tokens") or 0),
                     "first_byte_s": (round(float(got.get("first_byte_s") or 0) / answered, 4)
                                      if answered else None)}
    return out


def rollback_due(state: dict[str, Any]) -> str | None:
    """Why a canary is rolled back now (its error rate over max(5 %, twice the stable
    version's) once it has had 20 requests), or None."""
    counts = tally(state)
    canary, stable = counts.get("canary"), counts.get("stable")
    if canary is None or canary["requests"] < CANARY_MIN_REQUESTS:
        return None
    rate = canary["errors"] / canary["requests"]
    stable_rate = (stable["errors"] / stable["requests"]
                   if stable is not None and stable["requests"] else 0.0)
    limit = max(CANARY_MIN_RATE, 2 * stable_rate)
    if rate <= limit:
        return None
    return f"canary error rate {rate * 100:.1f} % over {limit * 100:.1f} %; rolled back"


def canary_of(row: Any, replicas: list[Any]) -> tuple[int, frozenset[str]]:
    """The share of requests a canary holds and its replicas (0 and none: no canary holds),
    for the routes table."""
    serving = [r for r in replicas if r.desired and not is_draining(r)]
    model_hash = row.definition_hash
    if mode_of(row, any(is_old(r, model_hash) for r in serving)) != CANARY:
        return 0, frozenset()
    return (settings_of(row).canary_percent,
            frozenset(r.id for r in serving if not is_old(r, model_hash)))
