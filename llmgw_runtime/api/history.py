"""The fleet's history as the control service keeps it (``GET /api/v1/history``, issue
29): per model and per device class, one point per minute over the last day, or per hour
over the last week, from what the reconciler saw and the routers reported. The console's
charts draw these points; docs/operations.md, "History and charts"."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .fields import MAX_LIST, Answer, Count, Finite, NonNegative, SmallCount

# How far back each range reaches, and its step (seconds).
RANGES: dict[str, tuple[int, int]] = {"24h": (86_400, 60), "7d": (7 * 86_400, 3_600)}
Range = Literal["24h", "7d"]
MINUTE_S = 60
HOUR_S = 3_600
MINUTES_KEPT_S = 2 * 86_400          # minute points are kept two days, hours history_days
MAX_POINTS = 24 * 60 + 1             # the most points of one series in one answer


class ModelPoint(Answer):
    """One model over one step starting at ``t`` (store clock): replicas ready and wanted,
    requests waiting and slots busy of the slots it has (the most seen in the step),
    requests refused and answered (summed), and the first-byte p50/p90 of those answered
    (None: none answered)."""

    t: Finite
    ready: SmallCount = 0
    wanted: SmallCount = 0
    waiting: SmallCount = 0
    busy: SmallCount = 0
    slots: SmallCount = 0
    refused: Count = 0
    requests: Count = 0
    first_byte_p50_s: NonNegative | None = None
    first_byte_p90_s: NonNegative | None = None


class ClassPoint(Answer):
    """One device class over one step starting at ``t``: devices of live nodes, devices
    held by replicas, ready replicas (the most seen in the step)."""

    t: Finite
    devices: SmallCount = 0
    used: SmallCount = 0
    replicas: SmallCount = 0


class History(Answer):
    """``since``/``until``: the range asked (store clock); ``step_s``: 60 or 3600."""

    range: Range
    since: Finite
    until: Finite
    step_s: int
    models: dict[str, list[ModelPoint]] = Field(default_factory=dict, max_length=MAX_LIST)
    classes: dict[str, list[ClassPoint]] = Field(default_factory=dict, max_length=MAX_LIST)
