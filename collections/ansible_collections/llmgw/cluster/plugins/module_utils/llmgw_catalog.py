# Copyright: llmgw maintainers
"""Pure functions: one catalog entry as declared, as the server stores it, and the difference.

The entry sent to the server holds only the fields the task declares; the server fills the
rest with its defaults and stores some fields in another form than the catalog writes them
(the one definition of every field, its default and its catalog form is
llmgw_runtime/api/catalog.py; this collection runs where llmgw_runtime is not installed, so
the names and defaults below are literals, which tests/collection/test_llmgw_model_fields.py
checks against that definition):

- ``replicas`` ``N`` or ``{min, max}``: ``replicas`` (the min), ``replicas_max`` (the max,
  null when fixed or equal to the min) and ``on_demand`` (true as well when the min is 0);
- ``idle_stop_after`` ``30m``: ``idle_stop_after_s`` 1800.0;
- ``autoscale``: every setting, in seconds, defaults filled in, for a model whose range
  leaves room to scale; null otherwise;
- ``max_tokens``: every setting, defaults filled in (``{}`` is stored as every default);
- ``rollout``: every setting, defaults filled in (``{}`` is stored as every default; not
  set is null, which the server reads as those defaults);
- ``drain_timeout_s`` ``2m``: 120.0 (a duration, stored in seconds);
- ``sha256`` in lower case, ``max_wait_s`` as a float, ``args`` as strings.

``declared()`` puts the task's fields in that form and ``stored()`` reads the server's model
in it, so a second run compares equal and reports no change. A declaration the server would
refuse is kept in a form no stored model has, so it is sent and the server says why.
"""

from __future__ import annotations

import re

# The fields compared, in the order a diff shows them: the server's names and forms.
FIELDS = ("name", "source", "engine", "profile", "replicas", "replicas_max", "on_demand",
          "idle_stop_after_s", "autoscale", "args", "strategy", "sha256", "size_bytes",
          "routing", "slots", "max_queue", "max_wait_s", "aliases", "fallback", "max_tokens",
          "rollout", "drain_timeout_s")
# The entry's optional fields, sent only when the task sets them.
OPTIONAL = ("replicas", "on_demand", "idle_stop_after", "autoscale", "args", "strategy",
            "sha256", "size_bytes", "routing", "slots", "max_queue", "max_wait_s", "aliases",
            "fallback", "max_tokens", "rollout", "drain_timeout_s")
# What the server stores for a field the entry leaves out (api/catalog.py ModelSpec); also
# what a control service older than a field is taken to hold.
DEFAULTS = {"replicas": 1, "replicas_max": None, "on_demand": False,
            "idle_stop_after_s": None, "autoscale": None, "args": [], "strategy": "binpack",
            "sha256": None, "size_bytes": None, "routing": "prefix-affinity", "slots": None,
            "max_queue": 100, "max_wait_s": 30.0, "aliases": [], "fallback": [],
            "max_tokens": None, "rollout": None, "drain_timeout_s": 120.0}
# autoscale's settings and defaults (api/catalog.py Autoscale); all but busy_below are
# durations.
AUTOSCALE_DEFAULTS = {"wait_target_s": 2.0, "up_after_s": 30.0, "busy_below": 0.3,
                      "down_after_s": 300.0, "cooldown_s": 60.0}
# max_tokens' settings and defaults (api/catalog.py MaxTokens).
MAX_TOKENS_DEFAULTS = {"default": None, "max": None, "clamp": False}
# rollout's settings and defaults (api/catalog.py Rollout): how a new definition replaces
# the running replicas.
ROLLOUT_DEFAULTS = {"max_surge": 1, "max_unavailable": 0, "canary_percent": 0}
# profile's sizes, each 1 by default (api/catalog.py Profile).
PROFILE_SIZES = ("gpus", "tp", "pp", "nodes")

_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_WHOLE_RE = re.compile(r"^\s*[+-]?\d+\s*$")


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


def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _as_int(value):
    """A string of digits as the int it writes (a templated ``"{{ n }}"``); else as is."""
    if isinstance(value, str) and _WHOLE_RE.match(value):
        return int(value)
    return value


def replicas_value(value):
    """``replicas`` as the entry sends it: a whole number or ``{min, max}``, strings of
    digits read as numbers (as an ``int`` option would); anything else is sent as it is
    for the server to refuse."""
    if isinstance(value, dict):
        return {k: _as_int(v) for k, v in value.items()}
    return _as_int(value)


def replica_fields(value, on_demand):
    """(replicas, replicas_max, on_demand) as the server stores ``replicas: value`` with
    ``on_demand`` (None: not set); the rule of llmgw_runtime/catalog/scale.replicas_of. A combination the
    server refuses keeps the raw value as ``replicas``, which no stored model has."""
    said = on_demand
    if isinstance(value, bool):     # yes/no: refused, and True would equal 1
        return str(value).lower(), None, said is True
    if not isinstance(value, dict):
        return value, None, said is True
    low, high = value.get("min"), value.get("max")
    if set(value) != {"min", "max"} or not _whole(low) or not _whole(high) or low > high \
            or (low == 0 and said is False) or (low > 0 and said is True):
        return dict(value), None, said is True
    return low, (high if high != low else None), said is True or low == 0


def scales(replicas, replicas_max, on_demand):
    """Whether the server scales the model (catalog_scale.scales): its max is above the
    replicas it keeps while wanted (an on-demand model at least one)."""
    if not _whole(replicas):
        return False
    floor = max(replicas, 1) if on_demand else replicas
    return (replicas_max or 0) > floor


def autoscale_fields(raw, replicas, replicas_max, on_demand):
    """``autoscale`` as the server stores it: every setting in seconds with the defaults
    filled in when the model scales, None when it does not. A setting the server refuses,
    or autoscale on a model that does not scale, keeps the raw mapping, which no stored
    model has."""
    can_scale = scales(replicas, replicas_max, on_demand)
    if raw is None:
        return dict(AUTOSCALE_DEFAULTS) if can_scale else None
    if not can_scale or not isinstance(raw, dict):
        return raw
    out = dict(AUTOSCALE_DEFAULTS)
    for key, value in raw.items():
        if key not in AUTOSCALE_DEFAULTS:
            return raw
        if key == "busy_below":
            number = value if isinstance(value, (int, float)) \
                and not isinstance(value, bool) else None
        else:
            number = parse_duration(value)
        if number is None:
            return raw
        out[key] = float(number)
    return out


def max_tokens_fields(raw):
    """``max_tokens`` as the server stores it: every setting with the defaults filled in,
    None when not set. A mapping with a setting the module does not know, or that is not a
    mapping, stays as it is: no stored model has that form, so it is sent and the server
    says why."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - set(MAX_TOKENS_DEFAULTS):
        return raw
    out = dict(MAX_TOKENS_DEFAULTS)
    out.update(raw)
    return out


def rollout_fields(raw):
    """``rollout`` as the server stores it: every setting with the defaults filled in, None
    when not set. A setting the module does not know, a value that is not a whole number, or
    a mapping that is not one stays as it is: no stored model has that form, so it is sent
    and the server says why (as it does for max_surge and max_unavailable both 0, which no
    stored model has either)."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - set(ROLLOUT_DEFAULTS):
        return raw
    out = dict(ROLLOUT_DEFAULTS)
    for key, value in raw.items():
        value = _as_int(value)
        if not _whole(value):
            return raw
        out[key] = value
    return out


def duration_field(value):
    """A duration as the server stores it (seconds, a float); an unparsable one stays as it
    is, so it never equals the stored one and the server gets to refuse it."""
    seconds = parse_duration(value)
    return seconds if seconds is not None or value is None else value


def normal_profile(profile):
    """A profile with the server's defaults filled in and unset options dropped."""
    profile = dict(profile or {})
    out = {k: v for k, v in profile.items() if v is not None}
    for key in PROFILE_SIZES:
        out.setdefault(key, 1)
    if out.get("memory_gb") is not None:
        out["memory_gb"] = float(out["memory_gb"])
    return out


def _float(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


def declared(params):
    """The entry the module's parameters declare: the PUT body and the compared fields.

    Returns (entry, fields): ``entry`` goes into ``{"models": [entry]}`` and holds only the
    fields set; ``fields`` is comparable with ``stored()`` of the server's model.
    """
    entry = {"name": params["name"], "source": params.get("source"),
             "engine": params.get("engine"), "profile": normal_profile(params.get("profile"))}
    for key in OPTIONAL:
        if params.get(key) is not None:
            entry[key] = params[key]
    if "replicas" in entry:
        entry["replicas"] = replicas_value(entry["replicas"])
    for key in ("autoscale", "max_tokens", "rollout"):
        if isinstance(entry.get(key), dict):
            entry[key] = {k: v for k, v in entry[key].items() if v is not None}
    if "args" in entry:
        entry["args"] = [str(a) for a in entry["args"]]
    return entry, comparable(entry)


def comparable(entry):
    """The compared fields of an entry, in the form the server stores them."""
    fields = {k: entry.get(k, DEFAULTS.get(k)) for k in FIELDS}
    replicas, replicas_max, on_demand = replica_fields(entry.get("replicas", 1),
                                                       entry.get("on_demand"))
    fields.update(replicas=replicas, replicas_max=replicas_max, on_demand=on_demand)
    fields["autoscale"] = autoscale_fields(entry.get("autoscale"), replicas, replicas_max,
                                           on_demand)
    # An unparsable duration never equals the stored one: the server gets to refuse it.
    fields["idle_stop_after_s"] = duration_field(entry.get("idle_stop_after"))
    fields["drain_timeout_s"] = duration_field(entry.get("drain_timeout_s",
                                                         DEFAULTS["drain_timeout_s"]))
    if isinstance(fields["sha256"], str):
        fields["sha256"] = fields["sha256"].lower()
    fields["max_wait_s"] = _float(fields["max_wait_s"])
    fields["max_tokens"] = max_tokens_fields(entry.get("max_tokens"))
    fields["rollout"] = rollout_fields(entry.get("rollout"))
    for key in ("args", "aliases", "fallback"):
        fields[key] = list(fields[key])
    return fields


def stored(model):
    """The compared fields of a model as the API returns it (None: not in the catalog).
    A field the answer lacks (a control service older than it) counts as its default."""
    if not model:
        return {}
    out = {k: model.get(k, DEFAULTS.get(k)) for k in FIELDS}
    out["profile"] = normal_profile(model.get("profile"))
    for key in ("args", "aliases", "fallback"):
        out[key] = [str(a) for a in (out[key] or [])]
    for key in ("idle_stop_after_s", "max_wait_s", "drain_timeout_s"):
        out[key] = _float(out[key])
    if isinstance(out["autoscale"], dict):
        out["autoscale"] = {k: _float(v) for k, v in out["autoscale"].items()}
    return out


def differences(before, after):
    """Names of the fields that differ (all of them when ``before`` is empty)."""
    return [k for k in FIELDS if before.get(k) != after.get(k)]
