"""How rollouts, drains and cordons read, in one place for every view: ``ctl replicas``,
``ctl models``, ``ctl nodes``, ``ctl status``, the console and the summary behind them.
Pure: dicts as the admin API and the summary hold them in, text out."""

from __future__ import annotations

import json
import math
from typing import Any

ROLLING = ("rolling", "canary", "failed")


def seconds(value: float) -> str:
    """``40 s``, ``3 min``, ``2 h``: the largest whole unit (a drain's time left)."""
    value = max(0.0, value)
    for unit, size in (("h", 3600), ("min", 60)):
        if value >= 2 * size:
            return f"{math.floor(value / size)} {unit}"
    return f"{math.ceil(value)} s"


def drain_text(draining: dict[str, Any]) -> str:
    """``draining (3 in flight, 40 s left)``: a replica finishing its requests."""
    return (f"draining ({draining.get('in_flight', 0)} in flight, "
            f"{seconds(draining.get('left_s', 0.0))} left)")


def replica_state(replica: dict[str, Any]) -> str:
    """A replica's state as the listings show it: ``draining (...)`` while it finishes
    its requests, ``ready, old definition`` while a rollout replaces it, else its state."""
    if replica.get("draining"):
        return drain_text(replica["draining"])
    state = str(replica["state"])
    if replica.get("current", True) is False and replica.get("desired", True):
        return f"{state}, old definition"
    return state


def rollout_state(model: dict[str, Any]) -> dict[str, Any] | None:
    """The model's stored rollout state (``{state, since, error, ...}``: a dict, or its
    JSON text as the row holds it), or None when it is not rolling."""
    value = model.get("rollout_state")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict) or value.get("state") not in ROLLING:
        return None
    return value


def canary_percent(model: dict[str, Any]) -> int:
    return int(((model.get("rollout") or {}).get("canary_percent")) or 0)


def rollout_of(model: dict[str, Any], replicas: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The summary's view of a model's rollout: state, new replicas ready of wanted, the
    canary's share, the error of a failed one, and the line every view shows (``rolling
    1/2``, ``canary 10 %``, ``rollout failed: <error>``); None when it is not rolling."""
    stored = rollout_state(model)
    if stored is None:
        return None
    state = stored["state"]
    if state == "canary" and stored.get("promoted"):
        state = "rolling"
    mine = [r for r in replicas if r["model"] == model["name"] and r.get("desired", True)
            and not r.get("draining")]
    new_ready = sum(1 for r in mine if r.get("current", True) and r["state"] == "ready")
    old_ready = sum(1 for r in mine if not r.get("current", True) and r["state"] == "ready")
    out = {"state": state, "new_ready": new_ready, "old_ready": old_ready,
           "wanted": model.get("wanted", 0), "canary_percent": canary_percent(model),
           "since": stored.get("since"), "error": stored.get("error")}
    out["text"] = rollout_text(out)
    return out


def rollout_text(r: dict[str, Any]) -> str:
    """``rolling 1/2`` (new replicas ready of wanted), ``canary 10 %``, ``rollout failed:
    <error>``."""
    if r["state"] == "failed":
        return "rollout failed" + (f": {r['error']}" if r.get("error") else "")
    if r["state"] == "canary":
        return f"canary {r['canary_percent']} %"
    return f"rolling {r['new_ready']}/{r['wanted']}"


def node_state(node: dict[str, Any]) -> str | None:
    """``draining`` or ``cordoned`` for a node taken out of placement, else None."""
    if node.get("draining"):
        return "draining"
    if node.get("cordoned"):
        return "cordoned"
    return None


def maintenance(nodes: list[dict[str, Any]], replicas: list[dict[str, Any]]
                ) -> list[dict[str, Any]]:
    """The cordoned and draining nodes, each with the replicas still on it (head or part)
    that are to keep running, for the summary."""
    held = [(node, state) for node in nodes if (state := node_state(node)) is not None]
    if not held:
        return []
    on: dict[str, int] = {}      # node -> wanted replicas on it (a replica counts once)
    for r in replicas:
        if r.get("desired", True):
            for name in {r["node"], *(p["node"] for p in r.get("parts") or [])}:
                on[name] = on.get(name, 0) + 1
    return [{"name": node["name"], "state": state, "replicas": on.get(node["name"], 0)}
            for node, state in held]
