"""What the admission shell (``gate.py``) reports of its models: the load of each model
since the last report (``ModelCapacity``, which the routes tick posts to the control
service), the requests in flight on each replica (what a draining replica waits for), and
the 429 that names why a model is at capacity. Read from the gate's state; a mixin of
:class:`~.gate.Gate`, nothing on the request path but the refusal."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ...api.router import MAX_QUEUE, ModelCapacity
from ...catalog.bounds import MAX_WAIT_S
from ..errors import ModelAtCapacity
from ..metrics import RouterMetrics
from ..tables.slots import UNLIMITED, SlotCounts
from .core import Admission, Rejected

QUEUE = "\0queue:"      # slot-count columns of a model's waiting requests: "\0queue:<model>"
_BIG = 1_000_000        # api.fields.SmallCount


@dataclass
class Interval:
    """What one model went through since the last capacity report."""
    queued: int = 0
    rejected: int = 0
    admitted: int = 0
    busy: int = 0          # the most slots the router's requests held at one admission
    waits: list[float] = field(default_factory=list)


class Reports:
    """The gate's reports (the gate sets these attributes)."""

    _counts: SlotCounts
    _clock: Callable[[], float]
    _cores: dict[str, Admission]
    _replicas: dict[str, tuple[str, ...]]
    _slots: dict[str, dict[str, int]]
    _interval: dict[str, Interval]
    _queued_at: dict[str, dict[int, float]]
    _max_queue: dict[str, int]
    _metrics: RouterMetrics

    def in_flight(self) -> dict[str, int]:
        """Replica -> requests this worker has in flight there now (streams until their
        last byte or their client's leaving), replicas with none left out: listed in the
        routes table or not (a draining replica's requests are counted until they end)."""
        out: dict[str, int] = {}
        for core in self._cores.values():
            for rid, n in core.in_flight_all().items():
                if n > 0:
                    out[rid] = out.get(rid, 0) + n
        return out

    def capacity(self) -> dict[str, ModelCapacity]:
        """The load of every model this worker admitted, queued, refused or answered
        requests of since the last call, or holds requests of now (the routes tick posts
        it to the control service, which scales on it and keeps its history), and starts
        a new interval. ``waiting``, ``in_flight``, ``slots`` and ``busy`` are the
        router's (all workers); ``rejected``, ``queued``, ``first_byte`` (the first-byte
        times counted per bucket: the requests answered), the wait p90 and the oldest
        wait this worker's."""
        interval, self._interval = self._interval, {}
        first_bytes = self._metrics.take_first_bytes()
        now = self._clock()
        out: dict[str, ModelCapacity] = {}
        for model, core in self._cores.items():
            stats = interval.get(model, Interval())
            rids = self._replicas.get(model, ())
            waiting = core.waiting(model)
            answered = first_bytes.get(model, [])
            if not (waiting or stats.queued or stats.rejected or stats.admitted
                    or answered or any(map(core.in_flight, rids))):
                continue
            with self._counts.locked():
                *in_flight_at, waiting = self._counts.totals((*rids, QUEUE + model))
            in_flight = sum(in_flight_at)
            waits = sorted(stats.waits)
            p90 = waits[min(len(waits) - 1, math.ceil(0.9 * len(waits)) - 1)] if waits else 0.0
            since = self._queued_at.get(model)
            oldest = now - min(since.values()) if since else 0.0
            # first_byte only when some were answered: a control service older than the
            # field refuses a post that names it
            counted = {"first_byte": [min(n, _BIG) for n in answered]} if answered else {}
            out[model] = ModelCapacity(
                waiting=min(waiting, MAX_QUEUE), in_flight=min(in_flight, _BIG),
                slots=min(sum(self._slots.get(model, {}).values()), _BIG),
                rejected=min(stats.rejected, _BIG), wait_p90_s=_seconds(p90),
                busy=min(max(stats.busy, in_flight), _BIG), oldest_wait_s=_seconds(oldest),
                queued=min(stats.queued, _BIG),
                at_capacity=bool(waiting or stats.queued or stats.rejected), **counted)
        return out

    def _at_capacity(self, core: Admission, model: str, decision: Rejected
                     ) -> ModelAtCapacity:
        slots = self._slots.get(model, {})
        n = len(slots)
        total = sum(slots.values())
        served = ("unlimited" if total >= UNLIMITED else str(total))
        with self._counts.locked():
            waiting = self._counts.totals((QUEUE + model,))[0]
        max_queue = self._max_queue.get(model, core.max_queue)
        if decision.reason == "queue_full":
            limit = (f"its queue is full (max_queue {max_queue}"
                     + (": this model does not queue" if max_queue == 0 else "") + ")")
        else:
            limit = (f"this request waited max_wait_s ({core.max_wait_s:g} s) without "
                     "getting one")
        return ModelAtCapacity(
            f"model '{model}' is at capacity: the {served} slot"
            + ("" if total == 1 else "s") + f" this router has on its {n} replica"
            + ("" if n == 1 else "s") + f" are all busy and {waiting} request"
            + (" waits" if waiting == 1 else "s wait") + f" for one; {limit}. Retry after "
            "the Retry-After seconds; if this persists, ask the operator for more replicas "
            "or slots (or a larger max_queue / max_wait_s in the catalog)",
            retry_after_s=decision.retry_after_s)


def _seconds(value: float) -> float:
    """A wait as a report carries it: within 0 .. MAX_WAIT_S."""
    return min(max(value, 0.0), MAX_WAIT_S)
