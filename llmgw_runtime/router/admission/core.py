"""Engine-slot admission: never more requests at a replica than it has slots, the rest
waiting in a bounded queue per model that is fair across API keys.

The core decides; a thin shell waits. :class:`Admission` keeps no clock (every call gets
``now``), never blocks and never yields, so under gevent each call is atomic; from real
threads, call it under one lock. A request either gets a replica at once
(:class:`Admitted`), a :class:`Ticket` to wait on (:class:`Queued`), or a refusal with a
reason and a Retry-After estimate (:class:`Rejected`). A waiting ticket is decided later by
:meth:`~Admission.release` (a slot freed), :meth:`~Admission.update` (replicas or slots
changed), :meth:`~Admission.expire` (``max_wait_s`` passed) or :meth:`~Admission.cancel`;
each such call returns the tickets it decided and passes each to ``on_decided``, where the
shell wakes whatever it waits on (a gevent Event it hung on ``ticket.waiter``, say).

Waiting tickets are served in the order of a bounded queue per model, fair across API
keys (``queue.py``: priority classes, keys in turn, and which ticket a full queue pushes
out for a newcomer). A freed slot goes to the first ticket in that order that may take it.

Prefix affinity: a request with a prefix key has a *home* replica. Where the shell gives
the core a table of where prefixes were served last (:attr:`Admission.homes`, shared by
the router's workers: ``tables/homes.py``), the home is the replica that served the prefix last
while it stays within its bounded load (:func:`.affinity.fits`), and its prompt is
*cached* there; a prefix not remembered (a first turn) or whose home is over its bound is
placed by load (:func:`.affinity.place`). Without the table the home is chosen by
consistent hashing with bounded loads alone (:func:`.affinity.choose`). Loads count what
each replica serves and has waiting for it. A request is admitted only at its home, or
waits for a slot there even when another replica has one free: a cached home for as long
as a request served away from its home takes (``fresh_s``: what moving costs, the prompt
computed anew), another for :data:`SPILL_SERVICES` mean service times (leaving the slots
elsewhere to the cached turns of those replicas); at most ``fleetvocab.home_wait_s``
(half of ``max_wait_s``). When more requests wait than the model has slots, one that is
not cached anywhere takes the first free slot anywhere (keeping a slot free for a cached
turn that may come only idles it then). After that any free slot will do, and the replica
it ends up on is remembered as its home. When a slot frees, a waiting request cached at that replica goes
first within the class served next (:meth:`~Admission._cached_turn`: shortest job first).
The bounded load keeps a hot prefix from piling onto one replica (its home moves on once
it holds more than 1.25 times the mean load and more than twice its slots). A request
without a prefix takes the replica with the most free slots.

In-flight counts are per replica and outlive membership: a replica removed and listed
again keeps the count of what it still serves, and slots that shrink below the in-flight
count admit nothing there until it drains.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ...api.catalog import default
from ...catalog.bounds import MAX_SLOTS_PER_REPLICA
from ...fleetvocab import home_wait_s
from .affinity import choose, fits, place
from .outcome import Admitted, Reason, Rejected
from .queue import PRIORITIES, FairQueue, Priority, Ticket

SERVICE_S_GUESS = 2.0     # a request's service time before any was measured
SERVICE_ALPHA = 0.2       # weight of the newest service time in the moving average
RETRY_AFTER_MAX_S = 60
SPILL_SERVICES = 2.0      # a ticket waits for its home replica this many mean service times
KNOWN_SLOTS = MAX_SLOTS_PER_REPLICA   # more slots than this: unknown


class Remembered(Protocol):
    """Where prefixes were served last (``homes.Homes``; a dict-backed one in tests)."""

    def get(self, key: bytes, replicas: Iterable[str]) -> str | None: ...

    def put(self, key: bytes, replica: str, now: float) -> None: ...


@dataclass(frozen=True)
class Queued:
    ticket: Ticket


Decision = Admitted | Queued | Rejected


@dataclass
class _Model:
    slots: dict[str, int] = field(default_factory=dict)   # replica -> slots, in table order
    queue: FairQueue = field(default_factory=FairQueue)
    service_s: float = SERVICE_S_GUESS
    fresh_s: float = SERVICE_S_GUESS    # ... of requests not served at a remembered home


def _ignore(_: Ticket) -> None:
    return None


def _allowed(m: _Model, only: frozenset[str] | None) -> list[str]:
    """The model's replicas a request may take: those of ``only`` that are listed, or
    every one (no restriction, or none of them listed any more)."""
    if only is None:
        return list(m.slots)
    return [rid for rid in m.slots if rid in only] or list(m.slots)


class Admission:
    """Slots, in-flight counts and fair queues of every model this router serves.

    ``max_queue``: tickets waiting per model; ``max_queue_per_key``: per API key and model
    (None: only the model's bound); ``max_wait_s``: how long a ticket may wait."""

    def __init__(self, max_queue: int = default("max_queue"),
                 max_wait_s: float = default("max_wait_s"),
                 max_queue_per_key: int | None = None,
                 on_decided: Callable[[Ticket], None] = _ignore) -> None:
        if max_queue < 0 or max_wait_s <= 0:
            raise ValueError("max_queue must be >= 0 and max_wait_s > 0")
        self.max_queue = max_queue
        self.max_wait_s = max_wait_s
        self.max_queue_per_key = max_queue_per_key
        self._on_decided = on_decided
        # Requests other processes have in flight per replica (the shell sets it with the
        # slots it passes): part of a replica's load when a prefix picks its home.
        self.others: Mapping[str, int] = {}
        # Where each prefix was served last (the shell's shared table): a remembered home
        # is kept while it fits its bounded load; a new prefix is placed by load. None:
        # homes by hashing alone.
        self.homes: Remembered | None = None
        self._models: dict[str, _Model] = {}
        self._inflight: dict[str, int] = {}
        self._model_of: dict[str, str] = {}
        self._ids = itertools.count(1)

    # -- reading ----------------------------------------------------------------------

    def in_flight(self, replica: str) -> int:
        return self._inflight.get(replica, 0)

    def in_flight_all(self) -> dict[str, int]:
        """Replica -> requests admitted there and not released (listed or not)."""
        return dict(self._inflight)

    def waiting(self, model: str) -> int:
        m = self._models.get(model)
        return m.queue.waiting if m else 0

    # -- deciding ---------------------------------------------------------------------

    def update(self, model: str, slots: Mapping[str, int], now: float) -> list[Ticket]:
        """The model's ready replicas and their slots are now ``slots``. Waiting tickets
        take slots that appeared; with no replica left they are refused (``no_replicas``:
        the shell goes back to waiting for the model to start). A replica's slots may be 0:
        listed, but no room now (the shell passes what other processes leave free)."""
        m = self._models.get(model)
        if m is not None and slots == m.slots:     # the common case: nothing changed
            return []
        for rid, n in slots.items():
            if n < 0:
                raise ValueError(f"replica {rid} of model {model} has {n} slots; at least 0")
        if m is None:
            m = self._models[model] = _Model()
        for rid in m.slots:
            if rid not in slots and self._model_of.get(rid) == model:
                del self._model_of[rid]
        m.slots = dict(slots)
        for rid in m.slots:
            self._model_of[rid] = model
        if not m.slots:
            return self._reject_where(m, lambda t: True, "no_replicas")
        return self._dispatch(m, now)

    def try_admit(self, model: str, key_id: str, priority: Priority,
                  replicas: Mapping[str, int], now: float,
                  prefix: bytes | None = None, only: frozenset[str] | None = None
                  ) -> Decision:
        """Admit a request for ``model`` from API key ``key_id`` now, queue it, or refuse it.
        ``replicas``: ready replica -> slots, as :meth:`update` (applied first: tickets it
        decides go to ``on_decided``). ``prefix``: its :func:`.affinity.prefix_key`.
        ``only``: the replicas it may take (a canary rollout's version), None: any; when
        none of them is listed any more, any."""
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, not {priority!r}")
        self.update(model, replicas, now)
        m = self._models[model]
        if not m.slots:
            return Rejected("no_replicas", 1)
        if m.queue.waiting:   # tickets whose wait for their home replica ended take slots first
            self._dispatch(m, now)
        if m.queue.waiting >= self.max_queue:   # make room of tickets overdue but not yet expired
            self._reject_where(m, lambda t: t.deadline <= now, "timeout")
        home, cached = (None, False) if prefix is None else self._home(m, prefix, only)
        # Every waiting ticket that could use a free slot has one (dispatch): a free slot
        # left is one no waiting ticket may take, so the newcomer does not jump a turn.
        rid = self._room_at(m, home) if home is not None else self._free_replica(m, None, only)
        if rid is not None:
            self._inflight[rid] = self._inflight.get(rid, 0) + 1
            self._remember(prefix, rid, now)
            return Admitted(rid, at_home=cached)
        if self.max_queue_per_key is not None and \
                m.queue.of_key(key_id) >= self.max_queue_per_key:
            return Rejected("queue_full", self._retry_after(m))
        if m.queue.waiting >= self.max_queue:
            victim = m.queue.push_out(key_id, priority)
            if victim is None:
                return Rejected("queue_full", self._retry_after(m))
            m.queue.remove(victim, rotate=False)
            self._decide(victim, Rejected("queue_full", self._retry_after(m)), [])
        # A remembered home holds the prefix's cache: worth waiting for as long as
        # computing it anew elsewhere takes (a request served away from its home). A
        # placed one waits a while too, leaving the slots elsewhere to the cached turns
        # of their replicas, unless more requests wait than there are slots (_dispatch).
        patience = m.fresh_s if cached else SPILL_SERVICES * m.service_s
        ticket = Ticket(next(self._ids), model, key_id, priority, prefix, now,
                        now + self.max_wait_s, home=home, cached=cached,
                        spill_at=now + min(home_wait_s(self.max_wait_s), patience), only=only)
        m.queue.add(ticket)
        return Queued(ticket)

    def release(self, replica: str, now: float, service_s: float | None = None,
                at_home: bool = False) -> list[Ticket]:
        """A request admitted to ``replica`` ended (``service_s``: how long it was served,
        for Retry-After estimates and how long a request waits for its home; ``at_home``:
        as its Admitted said); its slot goes to the next waiting ticket."""
        count = self._inflight.get(replica, 0) - 1
        if count > 0:
            self._inflight[replica] = count
        else:
            self._inflight.pop(replica, None)
        model = self._model_of.get(replica)
        if model is None:
            return []
        m = self._models[model]
        if service_s is not None and service_s >= 0:
            m.service_s += SERVICE_ALPHA * (service_s - m.service_s)
            if not at_home:
                m.fresh_s += SERVICE_ALPHA * (service_s - m.fresh_s)
        return self._dispatch(m, now)

    def cancel(self, ticket: Ticket, now: float) -> list[Ticket]:
        """The client of ``ticket`` went away. A waiting ticket leaves the queue at once; one
        already admitted gives its slot back, once (the shell must not also release it)."""
        if ticket.cancelled:
            return []
        ticket.cancelled = True
        if isinstance(ticket.outcome, Admitted):
            return self.release(ticket.outcome.replica, now)
        m = self._models.get(ticket.model)
        if ticket.outcome is None and m is not None:
            m.queue.remove(ticket, rotate=False)
        return []

    def expire(self, now: float) -> list[Ticket]:
        """Refuse (``timeout``) every ticket whose ``max_wait_s`` has passed, and give free
        slots to tickets whose wait for their home replica is over (the shell calls this
        every few milliseconds while tickets wait)."""
        decided: list[Ticket] = []
        for m in self._models.values():
            if m.queue.waiting:
                decided += self._reject_where(m, lambda t: t.deadline <= now, "timeout")
                decided += self._dispatch(m, now)
        return decided

    # -- inside -----------------------------------------------------------------------

    def _free_replica(self, m: _Model, prefix: bytes | None,
                      only: frozenset[str] | None = None) -> str | None:
        slots = m.slots
        rids = slots if only is None else _allowed(m, only)
        best, most = None, 0
        for rid in rids:
            room = slots[rid] - self._inflight.get(rid, 0)
            if room > most:
                best, most = rid, room
        if best is None or prefix is None:
            return best
        return choose(prefix, list(rids), self._inflight, slots)

    def _dispatch(self, m: _Model, now: float) -> list[Ticket]:
        """Give free slots to waiting tickets, in order of service: the first ticket (at
        most :data:`.queue.SCAN` looked at) that may take a free slot gets it: a ticket waiting
        for its home replica takes only a slot there until its ``spill_at``. One found
        overdue on the way is refused instead (its client has stopped waiting)."""
        decided: list[Ticket] = []
        while m.queue.waiting and any(n > self._inflight.get(rid, 0) for rid, n in m.slots.items()):
            # More requests wait than the model has slots: every free slot will be
            # wanted at once, so none is kept for a cached turn that may come; a request
            # not cached anywhere takes it (waiting for its placed home left slots idle
            # under overload). Cached turns still wait for their home.
            crowded = m.queue.waiting >= sum(m.slots.values())
            cached = self._cached_turn(m, now)
            if cached is not None:
                self._admit_ticket(m, cached, cached.home, now, decided)  # type: ignore[arg-type]
                continue
            for ticket in m.queue.in_order():
                if ticket.deadline <= now:
                    m.queue.remove(ticket, rotate=False)
                    self._decide(ticket, Rejected("timeout", self._retry_after(m)), decided)
                    break
                at_home = ticket.home is not None and now < ticket.spill_at \
                    and ticket.home in m.slots and (ticket.cached or not crowded)
                if at_home:
                    rid = self._room_at(m, ticket.home)  # type: ignore[arg-type]
                else:
                    rid = self._free_replica(m, ticket.prefix, ticket.only)
                if rid is not None:
                    self._admit_ticket(m, ticket, rid, now, decided)
                    break
            else:
                break     # no waiting ticket may take the free slots
        return decided

    def _cached_turn(self, m: _Model, now: float) -> Ticket | None:
        """With remembered homes: the first waiting ticket (of the class served next)
        whose home has a free slot. Its prompt is cached there: it is served in a moment,
        where a first turn computes its whole prompt, so it goes first (shortest job
        first, the order that most lowers the mean wait); the others keep their order."""
        if self.homes is None:
            return None
        served_next: str | None = None
        for ticket in m.queue.in_order():
            served_next = served_next or ticket.priority
            if ticket.priority != served_next:
                return None
            if ticket.cached and ticket.home is not None and ticket.deadline > now \
                    and now < ticket.spill_at and self._room_at(m, ticket.home) is not None:
                return ticket
        return None

    def _admit_ticket(self, m: _Model, ticket: Ticket, rid: str, now: float,
                      decided: list[Ticket]) -> None:
        m.queue.remove(ticket, rotate=True)
        self._inflight[rid] = self._inflight.get(rid, 0) + 1
        self._remember(ticket.prefix, rid, now)
        self._decide(ticket, Admitted(rid, at_home=ticket.cached and ticket.home == rid), decided)

    def _home(self, m: _Model, prefix: bytes,
              only: frozenset[str] | None = None) -> tuple[str, bool]:
        """The replica a prefix waits for, and whether its prompt is cached there. With
        remembered homes: where it was served last, while that fits its bounded load;
        else placed by load (a first turn: nothing cached anywhere). Without: by hashing."""
        rids = _allowed(m, only)
        loads, floors = self._loads(m), self._floors(m)
        if self.homes is None:
            return choose(prefix, rids, loads, floor=floors), False
        known = self.homes.get(prefix, rids)
        if known is not None and fits(known, rids, loads, floor=floors):
            return known, True
        return place(prefix, rids, loads, floor=floors), False

    def _remember(self, prefix: bytes | None, rid: str, now: float) -> None:
        if prefix is not None and self.homes is not None:
            self.homes.put(prefix, rid, now)

    def _room_at(self, m: _Model, rid: str) -> str | None:
        return rid if m.slots.get(rid, 0) > self._inflight.get(rid, 0) else None

    def _floors(self, m: _Model) -> dict[str, int]:
        """Per replica: the load a home may always take, one round of waiting requests:
        twice its slots (this router's, all workers); none for unknown slots."""
        others = self.others
        floors = {}
        for rid, n in m.slots.items():
            full = n + others.get(rid, 0)
            floors[rid] = 2 * full if full <= KNOWN_SLOTS else 0
        return floors

    def _loads(self, m: _Model) -> dict[str, int]:
        """Per replica: requests in flight and tickets waiting for it (bounded loads)."""
        others = self.others
        return {rid: self._inflight.get(rid, 0) + m.queue.pinned.get(rid, 0) + others.get(rid, 0)
                for rid in m.slots}

    def _reject_where(self, m: _Model, doomed: Callable[[Ticket], bool],
                      reason: Reason) -> list[Ticket]:
        decided: list[Ticket] = []
        victims = m.queue.where(doomed)
        for ticket in victims:
            m.queue.remove(ticket, rotate=False)
        for ticket in victims:  # after all left: the estimate sees the queue they leave
            self._decide(ticket, Rejected(reason, self._retry_after(m)), decided)
        return decided

    def _decide(self, ticket: Ticket, outcome: Admitted | Rejected,
                decided: list[Ticket]) -> None:
        ticket.outcome = outcome
        decided.append(ticket)
        self._on_decided(ticket)

    def _retry_after(self, m: _Model) -> int:
        """Seconds until a new request would likely get a slot: the tickets ahead of it,
        served ``sum(slots)`` at a time, each taking the recent mean service time."""
        capacity = max(1, sum(m.slots.values()))
        wait = m.service_s * (m.queue.waiting + 1) / capacity
        return max(1, min(RETRY_AFTER_MAX_S, math.ceil(wait)))

