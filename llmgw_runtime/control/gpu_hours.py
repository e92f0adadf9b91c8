"""GPU-hours: the device-time each model's replicas hold, counted by the reconciler, and
its answers per model and per API key (``GET /api/v1/usage/gpu-hours``, ``llmgw ctl usage
--gpu-hours``; docs/operations.md, "GPU-hours").

What counts: every device a replica holds while it is fetching, starting, ready (draining
too: a draining replica is a ready one), unreachable, or pending (placed, its agent not
started yet): placement reserves the devices from the moment it places a replica, so no
other replica can have them. Only on nodes heard from (fleetvocab.heard_from): a silent
node's devices hold nothing for anyone. Each device counts once per second it is held: a
replica on two GPUs counts two device-seconds a second (a multi-node replica its parts'
devices too); a device several replicas share (the CPU, a GPU of replicas that declare
memory_gb) is shared evenly among them, so a class's device-hours never exceed its
devices' hours. CPU time is counted as device-hours of class ``cpu``.

Per key: in each hour, a model's device-seconds are shared among the API keys by each
key's part of that model's tokens (prompt + completion) in that hour, as the routers
reported them (store/usage.py); the hours of a model that used no tokens in an hour are
``unattributed``. A cost is device-hours times the class's ``cost_per_device_hour``.

The reconciler (control/reconcile.py) calls :meth:`DeviceClock.observe` once per pass it
leads: the time since its previous pass is counted with the devices held at that pass
(split at an hour's end), and written to the store about once a minute, when it loses
leadership and when it stops. A gap longer than :func:`gap_bound_s` between two passes (a
stalled pass, the store away) is counted only up to that bound: time the reconciler did
not see is not guessed at.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, cast

from ..api.usage import DeviceHoursBy, DeviceHoursList, DeviceHoursRow
from ..errors import StoreError
from ..fleetvocab import ACTIVE, heard_from
from ..store import devicetime
from ..store.devicetime import Bucket, DeviceTime
from ..store.usage import HOUR_S, RETENTION_S, bucket_of
from .config import ControlConfig
from .snapshot import device_views

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 60.0        # pending device-seconds are written about this often
PRUNE_EVERY_S = HOUR_S      # and hours past the usage table's retention forgotten
UNKNOWN_CLASS = "(unknown)"   # a device a replica holds that its node no longer reports
MAX_PRICE = 1e9             # per device-hour: far above any price, below float trouble
BY_COLUMNS = {"model": ("model",), "key": ("key",), "key,model": ("key", "model")}
HOLDING = frozenset(ACTIVE)   # replica states whose devices count (pending to unreachable)


# ---------------------------------------------------------------- settings


def parse_costs(text: str) -> dict[str, float]:
    """``cost_per_device_hour`` ("CLASS=PRICE,...", e.g. "h100-80g=2.5,cpu=0") as
    {class: price}; ValueError naming the item to fix."""
    costs: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        klass, sep, price = (part.strip() for part in item.partition("="))
        if not sep or not klass:
            raise ValueError(f"{item[:60]!r} is not CLASS=PRICE; write e.g. "
                             "h100-80g=2.5,cpu=0")
        try:
            value = float(price)
        except ValueError:
            value = math.nan
        if not 0 <= value <= MAX_PRICE:     # also NaN
            raise ValueError(f"{item[:60]!r}: the price must be a number from 0 to "
                             f"{MAX_PRICE:g} (per device-hour)")
        if klass in costs:
            raise ValueError(f"class {klass[:60]!r} is priced twice; name each class once")
        costs[klass] = value
    return costs


def gap_bound_s(config: ControlConfig) -> float:
    """The most one interval between two passes counts: two report intervals (two
    reconcile intervals when those are longer). A longer gap is time the reconciler did
    not see (a stalled pass, the store away)."""
    return 2 * max(config.report_interval_s, config.reconcile_interval_s)


# ---------------------------------------------------------------- counting (pure)


def _ids(devices: Any) -> tuple[int, ...]:
    """A replica's (or part's) placement ids from its row's JSON; none when the row holds
    something else (written by hand, or before rows were checked). Text is read once
    (:func:`_ids_of`): every pass asks again of every replica."""
    if isinstance(devices, str):
        return _ids_of(devices)
    return _whole(devices)


@functools.lru_cache(maxsize=65536)
def _ids_of(text: str) -> tuple[int, ...]:
    try:
        return _whole(json.loads(text))
    except ValueError:
        return ()


def _whole(value: Any) -> tuple[int, ...]:
    try:
        return tuple(d for d in value or [] if isinstance(d, int) and not isinstance(d, bool))
    except TypeError:
        return ()


def _classes(node: Any) -> Mapping[int, str]:
    """A node's device classes by id, read as the planner reads its stored report
    (snapshot.device_views, cached); a report it cannot use gives none, so its devices
    count under UNKNOWN_CLASS instead of stopping the pass (placement leaves that node out
    and says why). Made once per report text (:func:`_classes_of`; read only)."""
    devices = node.devices if isinstance(node.devices, str) else json.dumps(node.devices)
    return _classes_of(devices)


@functools.lru_cache(maxsize=16384)
def _classes_of(devices: str) -> Mapping[int, str]:
    try:
        return MappingProxyType({d.id: d.klass or UNKNOWN_CLASS
                                 for d in device_views(devices)})
    except (ValueError, TypeError, KeyError, AttributeError):
        return MappingProxyType({})


def held(replicas: Iterable[Any], parts: Mapping[str, list[Any]], nodes: Iterable[Any],
         now: float, node_timeout_s: float) -> dict[tuple[str, str], float]:
    """The devices each model holds now, by (model, device class): rows as the store
    holds them (``repo.list_replicas``, ``parts_by_replica``, ``list_nodes``). A device
    shared by n counted replicas counts 1/n for each."""
    alive = _alive(nodes, now, node_timeout_s)
    return _total({name: _node_held(_classes(alive[name]), pieces)
                   for name, pieces in _pieces(replicas, parts).items() if name in alive})


def _alive(nodes: Iterable[Any], now: float, node_timeout_s: float) -> dict[str, Any]:
    """The nodes heard from (a silent node's devices hold nothing for anyone)."""
    return {node.name: node for node in nodes
            if heard_from(node.last_report, now, node_timeout_s)}


Piece = tuple[str, Any]         # (model, the devices text of a replica or part)


def _pieces(replicas: Iterable[Any], parts: Mapping[str, list[Any]]
            ) -> dict[str, list[Piece]]:
    """What the holding replicas (their worker parts too) hold, by node: (model,
    devices) in replica order."""
    out: dict[str, list[Piece]] = defaultdict(list)
    for r in replicas:
        if r.state not in HOLDING:
            continue
        out[r.node].append((r.model, r.devices))
        for p in parts.get(r.id, ()):
            out[p.node].append((r.model, p.devices))
    return out


def _node_held(classes: Mapping[int, str], pieces: list[Piece]
               ) -> dict[tuple[str, str], float]:
    """What one node's ``pieces`` hold, by (model, class of the device)."""
    users: dict[int, list[str]] = defaultdict(list)
    for model, devices in pieces:
        for d in _ids(devices):
            users[d].append(model)
    out: dict[tuple[str, str], float] = defaultdict(float)
    for d, models in users.items():
        klass = classes.get(d, UNKNOWN_CLASS)
        for model in models:
            out[(model, klass)] += 1 / len(models)
    return out


def _total(by_node: Mapping[str, Mapping[tuple[str, str], float]]
           ) -> dict[tuple[str, str], float]:
    """The nodes' counts summed, in node name order (the same sum whatever order the
    replicas came in)."""
    out: dict[tuple[str, str], float] = defaultdict(float)
    for name in sorted(by_node):
        for key, count in by_node[name].items():
            out[key] += count
    return dict(out)


def split(start: float, end: float,
          devices: Mapping[tuple[str, str], float]) -> dict[Bucket, float]:
    """Device-seconds of ``devices`` (by model and class) held from ``start`` to ``end``,
    by (hour start, model, class): an interval across an hour's end counts in both."""
    out: dict[Bucket, float] = {}
    t = start
    while t < end:
        hour = bucket_of(t)
        upto = min(end, hour + HOUR_S)
        for (model, klass), count in devices.items():
            if count > 0:
                out[(hour, model, klass)] = out.get((hour, model, klass), 0.0) \
                    + count * (upto - t)
        t = upto
    return out


def counted(last: float | None, now: float, bound_s: float) -> tuple[float, float] | None:
    """The interval a pass at ``now`` counts with what the pass at ``last`` saw: from
    ``last``, at most ``bound_s`` long; none on the first pass (or a clock gone back)."""
    if last is None or now <= last:
        return None
    return last, min(now, last + bound_s)


class DeviceClock:
    """The reconciler's device-time: counted at every pass it leads, kept here and
    written about once a minute (in the pass's fenced transaction), at leadership loss and
    at stop. What could not be written stays for the next try: two leaders' counted
    intervals lie inside their own leases, so they never overlap."""

    def __init__(self, config: ControlConfig) -> None:
        self.node_timeout_s = config.node_timeout_s
        self.bound_s = gap_bound_s(config)
        self.pending: dict[Bucket, float] = {}
        self.last: float | None = None          # the previous pass
        self.held: dict[tuple[str, str], float] = {}    # what it saw held
        self.flushed: float | None = None       # when pending was last written
        self.pruned: float | None = None
        self.unwritten = False                  # a flush failed (warned once)
        # each node's count, with the classes and pieces it was made of (:meth:`_count`)
        self._by_node: dict[str, tuple[Mapping[int, str], list[Piece],
                                       dict[tuple[str, str], float]]] = {}

    def observe(self, conn: Any, now: float, nodes: Iterable[Any],
                replicas: tuple[Iterable[Any], Mapping[str, list[Any]]]) -> None:
        """One pass, leading (``conn``: its transaction, the lease held, after the pass's
        changes; ``nodes``: the node rows the pass read; ``replicas``: the replicas that
        hold devices as the pass left them, and their worker parts,
        control/reconcile.py ``holding_after``): count the time since the previous pass
        with the devices held then, see what is held now; write when a minute is up."""
        interval = counted(self.last, now, self.bound_s)
        if interval is not None:
            for bucket, seconds in split(*interval, self.held).items():
                self.pending[bucket] = self.pending.get(bucket, 0.0) + seconds
        self.last = now
        self._count(*replicas, nodes, now)
        if self.flushed is None:
            self.flushed = now
        if now - self.flushed >= FLUSH_EVERY_S:
            self._write(conn, now)

    def _count(self, rows: Iterable[Any], parts: Mapping[str, list[Any]],
               nodes: Iterable[Any], now: float) -> None:
        """``held`` as :func:`held` counts it, with each node counted again only when its
        device classes or what its replicas hold there moved (new readings of a node, a
        temperature, keep its classes; a restart from ready to starting keeps a replica
        holding): at 10,000 nodes a pass that starts one replica counts one node, not
        4,000 (40 ms)."""
        alive = _alive(nodes, now, self.node_timeout_s)
        kept = {}
        moved = False
        for name, pieces in _pieces(rows, parts).items():
            node = alive.get(name)
            if node is None:
                continue
            classes = _classes(node)
            hit = self._by_node.get(name)
            if hit is None or hit[1] != pieces or hit[0] != classes:
                hit = (classes, pieces, _node_held(classes, pieces))
                moved = True
            kept[name] = hit
        if moved or kept.keys() != self._by_node.keys():
            self.held = _total({name: hit[2] for name, hit in kept.items()})
        self._by_node = kept

    def _write(self, conn: Any, now: float) -> None:
        # In the pass's transaction: if it fails to commit, that minute is lost (not
        # counted twice).
        devicetime.add(conn, self.pending)
        self.pending = {}
        self.flushed = now
        if self.pruned is None or now - self.pruned >= PRUNE_EVERY_S:
            devicetime.prune(conn, bucket_of(now - RETENTION_S))
            self.pruned = now

    def flush(self, store: Any) -> None:
        """Write what is pending in a transaction of its own (leadership lost, or the
        reconciler stopping); the next pass that leads starts counting afresh. A store
        that fails keeps it pending."""
        self.last, self.held, self._by_node = None, {}, {}
        if not self.pending:
            return
        try:
            with store.begin() as conn:
                devicetime.add(conn, self.pending)
        except StoreError as exc:
            if not self.unwritten:      # once, not at every follower's cycle
                log.warning("%.0f device-seconds counted are not written yet (kept for the "
                            "next try): %s", sum(self.pending.values()), exc)
            self.unwritten = True
            return
        self.pending, self.unwritten = {}, False


# ---------------------------------------------------------------- answers


def attribute(times: Iterable[DeviceTime], tokens: Mapping[tuple[float, str], Mapping[str, int]],
              by: str) -> tuple[dict[tuple[str, ...], float], dict[tuple[str, str], float]]:
    """Device-seconds summed ``by`` model, key or key and model, keyed by those then the
    class; and the unattributed ones by (model, class) (only by key: by model every
    second is the model's). ``tokens``: per (hour, model), each key's tokens."""
    rows: dict[tuple[str, ...], float] = defaultdict(float)
    unattributed: dict[tuple[str, str], float] = defaultdict(float)
    for t in times:
        if by == "model":
            rows[(t.model, t.device_class)] += t.seconds
            continue
        used = {k: n for k, n in tokens.get((t.bucket, t.model), {}).items() if n > 0}
        total = sum(used.values())
        if not total:
            unattributed[(t.model, t.device_class)] += t.seconds
            continue
        for key, n in used.items():
            group = (key,) if by == "key" else (key, t.model)
            rows[(*group, t.device_class)] += t.seconds * n / total
    return dict(rows), dict(unattributed)


def _row(columns: tuple[str, ...], values: tuple[str, ...], seconds: float,
         costs: Mapping[str, float]) -> DeviceHoursRow:
    *names, klass = values
    hours = seconds / HOUR_S
    price = costs.get(klass)
    return DeviceHoursRow(**dict(zip(columns, names, strict=True)), device_class=klass,
                          device_hours=round(hours, 6),
                          cost=None if price is None else round(hours * price, 6))


def device_hours(conn: Any, now: float, since: float, by: str,
                 costs: Mapping[str, float]) -> DeviceHoursList:
    """Device-hours in the last ``since`` seconds (from the start of the hour that period
    began in) summed ``by`` "model", "key" or "key,model", per device class, priced by
    ``costs`` ({class: price per device-hour}; a class not there has no cost)."""
    start = bucket_of(now - since)
    times = devicetime.read(conn, start, now)
    tokens = devicetime.tokens_by_hour(conn, start, now) if by != "model" else {}
    rows, unattributed = attribute(times, tokens, by)
    columns = BY_COLUMNS[by]
    return DeviceHoursList(
        since=start, until=now, by=cast(DeviceHoursBy, by),
        rows=[_row(columns, k, s, costs) for k, s in sorted(rows.items())],
        unattributed=[_row(("model",), k, s, costs) for k, s in sorted(unattributed.items())])
