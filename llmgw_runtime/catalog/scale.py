"""A catalog entry's replicas: a fixed number or a range, and how the range is used.

``replicas: N`` keeps N running (min = max = N). ``replicas: {min: M, max: N}`` lets the
control service scale the model between M and N on what the routers report
(control/autoscale.py, docs/autoscaling.md); ``min: 0`` is an on-demand model (no replica
until the first request, as ``on_demand: true``). ``autoscale`` tunes the rule, each
setting with a documented default. Pure: catalog/parse.py parses entries with these; the
settings and their bounds are defined in api/catalog.py (``Autoscale``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..api.catalog import Autoscale, bounds, catalog_names
from .bounds import MAX_REPLICAS, brief, brief_text, unknown_fields, whole
from .spec import parse_duration

AUTOSCALE_FIELDS = catalog_names(Autoscale)
_DURATIONS = ("up_after_s", "down_after_s", "cooldown_s")


@dataclass(frozen=True)
class Replicas:
    """What an entry's ``replicas`` and ``on_demand`` say: ``count`` is the min (the
    number kept running; for an on-demand model, what the first request starts, at least
    1), ``maximum`` the max when it differs (None: fixed), ``on_demand`` whether the model
    waits for its first request."""

    count: int
    maximum: int | None
    on_demand: bool


def replica_range(replicas: int, maximum: int | None, on_demand: bool) -> tuple[int, int]:
    """(min, max) as an operator reads them: an on-demand model's min is 0; its max is
    what its first request starts when it has no range."""
    floor = active_floor(replicas, on_demand)
    return (0 if on_demand else replicas), max(floor, maximum or 0)


def active_floor(replicas: int, on_demand: bool) -> int:
    """Replicas a model keeps while it is wanted: an activated on-demand model at least 1."""
    return max(int(replicas), 1) if on_demand else int(replicas)


def scales(replicas: int, maximum: int | None, on_demand: bool) -> bool:
    """Whether the range leaves the control service room to scale."""
    return replica_range(replicas, maximum, on_demand)[1] > active_floor(replicas, on_demand)


def _whole(problems: list[str], where: str, value: Any, minimum: int) -> int | None:
    """A replica count from ``minimum`` to MAX_REPLICAS; None (and a problem) otherwise."""
    before = len(problems)
    count = whole(problems, where, value, minimum, MAX_REPLICAS, "MAX_REPLICAS")
    return count if len(problems) == before else None


def replicas_of(problems: list[str], who: str, raw: dict[str, Any]) -> Replicas:
    """The entry's ``replicas`` (a whole number or ``{min, max}``) with its ``on_demand``;
    every problem is added to ``problems``, naming the field and the fix."""
    value = raw.get("replicas", 1)
    said = raw.get("on_demand")
    on_demand = said is True
    if said is not None and not isinstance(said, bool):
        problems.append(f"{who}: on_demand must be true or false, not {brief(said)}")
    if not isinstance(value, dict):
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"{who}: replicas must be a whole number or a range like "
                            f"{{min: 1, max: 3}}, not {brief(value)}")
            return Replicas(1, None, on_demand)
        count = _whole(problems, f"{who}: replicas", value, 0)
        return Replicas(count if count is not None else 1, None, on_demand)
    for key in value:
        if key not in ("min", "max"):
            problems.append(f"{who}: replicas.{brief_text(key)} is not a known field; a "
                            "range is {min: M, max: N}")
    if "min" not in value or "max" not in value:
        problems.append(f"{who}: replicas as a range needs both min and max, like "
                        "{min: 1, max: 3} (min 0: started by the first request)")
        return Replicas(1, None, on_demand)
    low = _whole(problems, f"{who}: replicas.min", value["min"], 0)
    high = _whole(problems, f"{who}: replicas.max", value["max"], 1)
    if low is None or high is None:
        return Replicas(1, None, on_demand)
    if low > high:
        problems.append(f"{who}: replicas.min ({low}) is above replicas.max ({high}); "
                        "swap them")
        return Replicas(1, None, on_demand)
    if low == 0 and said is False:
        problems.append(f"{who}: replicas.min 0 means on demand (no replica until the first "
                        "request); remove on_demand: false, or set min to 1 to keep one "
                        "running")
    if low > 0 and said is True:
        problems.append(f"{who}: on_demand: true is the same as replicas.min 0; write "
                        f"replicas: {{min: 0, max: {high}}} and remove on_demand, or "
                        "remove on_demand to keep min replicas running")
    return Replicas(low, high if high != low else None, on_demand or low == 0)


def autoscale_of(problems: list[str], who: str, raw: Any, replicas: Replicas,
                 max_wait_s: float) -> Autoscale | None:
    """The entry's ``autoscale`` settings (each with its default); None for a model whose
    replicas leave nothing to scale (an ``autoscale`` there is a problem)."""

    can_scale = scales(replicas.count, replicas.maximum, replicas.on_demand)
    if raw is None:
        return Autoscale() if can_scale else None
    if not can_scale:
        problems.append(f"{who}: autoscale applies to a model whose replicas is a range it "
                        "can grow in, like replicas: {min: 1, max: 3}; set one, or remove "
                        "autoscale")
        return None
    if not isinstance(raw, dict):
        problems.append(f"{who}: autoscale must be a mapping like {{wait_target_s: 2, "
                        f"up_after_s: 30s}}, not {brief(raw)}")
        return None
    before = len(problems)
    unknown_fields(problems, who, "autoscale.", raw, AUTOSCALE_FIELDS)
    values: dict[str, float] = {}
    for key in _DURATIONS + ("wait_target_s",):
        if key not in raw:
            continue
        try:
            seconds = parse_duration(raw[key])
        except ValueError as exc:
            problems.append(f"{who}: autoscale.{key} {exc}")
            continue
        limit = bounds(key, Autoscale)["le"]
        if seconds > limit:
            problems.append(f"{who}: autoscale.{key} must be at most {limit:g} s, not "
                            f"{seconds:g} s")
            continue
        values[key] = seconds
    wait = values.get("wait_target_s")
    if wait is not None and wait >= max_wait_s:
        problems.append(f"{who}: autoscale.wait_target_s ({wait:g} s) must be below "
                        f"max_wait_s ({max_wait_s:g} s): no request waits longer than "
                        "max_wait_s; lower the target or raise max_wait_s")
    if "busy_below" in raw:
        busy = raw["busy_below"]
        if isinstance(busy, bool) or not isinstance(busy, int | float) \
                or not math.isfinite(busy) or not 0 < busy < 1:
            problems.append(f"{who}: autoscale.busy_below must be a share of the slots "
                            f"between 0 and 1 (0.3: under 30 % busy), not {brief(busy)}")
        else:
            values["busy_below"] = float(busy)
    if len(problems) > before:
        return None
    return Autoscale(**values)
