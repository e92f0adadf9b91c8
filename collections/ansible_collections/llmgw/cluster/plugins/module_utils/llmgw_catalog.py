# Copyright: llmgw maintainers
"""Pure functions: one catalog entry as declared, as the server stores it, and the difference.

The server fills defaults (profile gpus/tp/pp/nodes 1, replicas 1, on_demand false, args [])
and stores idle_stop_after as seconds (idle_stop_after_s); comparing both sides after the
same normalisation keeps a second run from reporting a change.
"""

from __future__ import annotations

import re

# The fields the module declares and compares, in the order a diff shows them.
FIELDS = ("name", "source", "engine", "profile", "replicas", "on_demand", "idle_stop_after_s",
          "args")
PROFILE_SIZES = ("gpus", "tp", "pp", "nodes")

_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value):
    """Seconds for ``30m``, ``1h``, ``90s``, ``2d`` or a number; None when it is not one
    (the server then refuses it and says why)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    match = _DURATION_RE.match(str(value).strip())
    if not match:
        return None
    return float(match.group(1)) * _UNITS[match.group(2)]


def normal_profile(profile):
    """A profile with the server's defaults filled in and unset options dropped."""
    profile = dict(profile or {})
    out = {k: v for k, v in profile.items() if v is not None}
    for key in PROFILE_SIZES:
        out.setdefault(key, 1)
    if out.get("memory_gb") is not None:
        out["memory_gb"] = float(out["memory_gb"])
    return out


def declared(params):
    """The entry the module's parameters declare: the PUT body and the compared fields.

    Returns (entry, fields): ``entry`` goes into ``{"models": [entry]}``; ``fields`` is
    comparable with ``stored()`` of the server's model.
    """
    profile = normal_profile(params.get("profile"))
    replicas = params.get("replicas")
    on_demand = params.get("on_demand")
    args = [str(a) for a in (params.get("args") or [])]
    entry = {"name": params["name"], "source": params.get("source"),
             "engine": params.get("engine"), "profile": profile,
             "replicas": 1 if replicas is None else replicas,
             "on_demand": bool(on_demand), "args": args}
    idle = params.get("idle_stop_after")
    if idle is not None:
        entry["idle_stop_after"] = idle
    fields = {k: entry[k] for k in FIELDS if k in entry}
    idle_s = parse_duration(idle)
    # An unparsable duration never equals the stored one: the server gets to refuse it.
    fields["idle_stop_after_s"] = idle_s if idle_s is not None or idle is None else idle
    return entry, fields


def stored(model):
    """The compared fields of a model as the API returns it (None: not in the catalog)."""
    if not model:
        return {}
    out = {k: model.get(k) for k in FIELDS}
    out["profile"] = normal_profile(model.get("profile"))
    out["args"] = [str(a) for a in (model.get("args") or [])]
    if out["idle_stop_after_s"] is not None:
        out["idle_stop_after_s"] = float(out["idle_stop_after_s"])
    return out


def differences(before, after):
    """Names of the fields that differ (all of them when ``before`` is empty)."""
    return [k for k in FIELDS if before.get(k) != after.get(k)]
