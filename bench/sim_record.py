"""What the simulated agents (bench/agent_sim.py) record of their sends, and what a
measured window of them got: latency percentiles from the schedule and from the send, the
answers' kinds, and a timeline (each second's count, p99 and max), so a run shows when its
tail happened: beside an apply, a pass or the whole window."""

from __future__ import annotations

import math
from array import array
from typing import Any

KINDS = ("full", "heartbeat", "heartbeat+full")   # what one sample sent


class Record:
    """Every answered or failed send: compact arrays, appended when the send ends."""

    def __init__(self) -> None:
        self.sched = array("d")           # scheduled send time (perf_counter)
        self.latency = array("d")         # seconds to the whole answer; NaN: failed
        self.lag = array("d")             # seconds the send began after its schedule
        self.kind = array("b")            # index into KINDS
        self.host = array("b")
        self.errors: dict[int, str] = {}  # sample index -> what failed
        self.reconnects = 0
        self.marks: list[tuple[float, int]] = []   # (time, samples so far), every second

    def add(self, sched: float, latency: float | None, kind: int, host: int,
            error: str | None = None, lag: float = 0.0) -> None:
        if error is not None:
            self.errors[len(self.sched)] = error
        self.sched.append(sched)
        self.latency.append(math.nan if latency is None else latency)
        self.lag.append(lag)
        self.kind.append(kind)
        self.host.append(host)

    def first_index(self, start: float) -> int:
        """A sample scheduled at or after ``start`` ends after it: none comes before the
        count marked at or before ``start``."""
        found = 0
        for at, count in self.marks:
            if at > start:
                break
            found = count
        return found


def pct(values: list[float], p: float) -> float:
    """The ``p`` th percentile of sorted ``values`` in milliseconds (NaN when empty)."""
    return values[min(len(values) - 1, int(p / 100 * len(values)))] * 1000 \
        if values else math.nan


def timeline(seconds: list[list[float]]) -> list[tuple[int, float, float]]:
    """Per second of the window: (answered, p99 ms, max ms) of the sends scheduled in it."""
    out = []
    for lat in seconds:
        lat.sort()
        out.append((len(lat), pct(lat, 99), lat[-1] * 1000 if lat else math.nan))
    return out


def window(rec: Record, hosts_n: int, inflight: list[float], churned: dict[str, int],
           start: float, end: float) -> dict[str, Any]:
    """What the sends scheduled in [start, end) got; ``done_rate``: the answers that came
    in it, whenever they were sent (what a saturated server still answered); ``late``:
    the sends still unanswered (``inflight``: their scheduled times) that were due in it."""
    lat: list[float] = []
    lags: list[float] = []                         # of the answered: the send's lateness
    sent: list[float] = []                         # ... and the latency from the send
    seconds: list[list[float]] = [[] for _ in range(max(1, math.ceil(end - start)))]
    errors: dict[str, int] = {}
    kinds = [0] * len(KINDS)
    hosts = [0] * hosts_n
    done = 0                                       # answers that came in the window
    for i in range(rec.first_index(start), len(rec.sched)):
        latency = rec.latency[i]
        if latency == latency and start <= rec.sched[i] + latency < end:
            done += 1
        if not start <= rec.sched[i] < end:
            continue
        kinds[rec.kind[i]] += 1
        if latency == latency:                     # not NaN: answered
            lat.append(latency)
            lags.append(rec.lag[i])
            sent.append(latency - rec.lag[i])
            hosts[rec.host[i]] += 1
            seconds[min(len(seconds) - 1, int(rec.sched[i] - start))].append(latency)
        else:
            what = rec.errors.get(i, "?")
            errors[what] = errors.get(what, 0) + 1
    lat.sort()
    lags.sort()
    sent.sort()
    late = sum(1 for at in inflight if start <= at < end)
    span = end - start
    return {"ok": True, "answered": len(lat), "rate": len(lat) / span, "done_rate": done / span,
            "p50_ms": pct(lat, 50), "p95_ms": pct(lat, 95), "p99_ms": pct(lat, 99),
            "lag_p99_ms": pct(lags, 99), "sent_p99_ms": pct(sent, 99),
            "max_ms": lat[-1] * 1000 if lat else math.nan, "errors": errors, "late": late,
            "kinds": dict(zip(KINDS, kinds, strict=True)),
            "host_rates": [n / span for n in hosts], "reconnects": rec.reconnects,
            "churned": dict(churned), "timeline": timeline(seconds)}
