"""What a catalog value means, apart from its entry: durations as the catalog writes them.

The entry itself, every field with its type, default and bounds, is api/catalog.py's
``ModelSpec``; catalog/parse.py reads the YAML into it. Pure.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .bounds import brief

DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_duration(value: Any) -> float:
    """``30m``, ``1h``, ``90s``, ``2d`` or a number of seconds (finite)."""
    if isinstance(value, bool):
        raise ValueError("is a boolean")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError("is too large a number of seconds") from None
        if not math.isfinite(seconds):
            raise ValueError(f"must be a finite number of seconds, not {seconds}")
        if seconds <= 0:
            raise ValueError("must be above zero")
        return seconds
    text = str(value).strip() if isinstance(value, str) else ""
    match = DURATION_RE.match(text) if len(text) <= 32 else None
    if not match:
        raise ValueError(f"{brief(value)} is not a duration; write it like 30m, 1h or 90s")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError("must be above zero")
    return seconds
