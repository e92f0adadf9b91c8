"""The requests of one model waiting for a slot, in order of service: bounded and fair
across API keys (the admission core's queue, ``core.py``; pure like it).

Order of service: a higher priority class first (``high``, ``normal``, ``low``; strict, so
a lower class waits while a higher one has tickets, up to ``max_wait_s``); within a class,
round-robin over API keys (each request costs one turn: deficit round robin with equal
costs), so a key that queued 20 requests cannot hold back a key that queued 2; within a
key, first come first served.

A full queue makes room for a newcomer by refusing (``queue_full``) the newest ticket of a
lower class, or of a key holding at least two more tickets than the newcomer's key
(:meth:`FairQueue.push_out`): one key's burst fills the queue only while no one else
wants it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from .outcome import Admitted, Rejected

Priority = Literal["high", "normal", "low"]
PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low")
SCAN = 64                 # waiting tickets looked at for a free slot, at most


@dataclass(eq=False)
class Ticket:
    """A request waiting for a slot. ``outcome`` is None while it waits, then what was
    decided; ``waiter`` is the shell's (the core never reads it)."""
    id: int
    model: str
    key_id: str
    priority: Priority
    prefix: bytes | None
    enqueued_at: float
    deadline: float
    outcome: Admitted | Rejected | None = None
    cancelled: bool = False
    waiter: Any = None
    home: str | None = None     # the replica its prefix belongs to: it waits for that one
    cached: bool = False        # ... where it was served last (its prompt is cached there)
    spill_at: float = 0.0       # ... until then; after, any replica with a free slot
    only: frozenset[str] | None = None   # the replicas it may take (a canary's version)


class FairQueue:
    """The waiting tickets of one model: per class, API keys in turn, each key's oldest
    first; with counts per key (its bound) and per home replica (part of its load)."""

    def __init__(self) -> None:
        self.classes: dict[Priority, OrderedDict[str, deque[Ticket]]] = {
            p: OrderedDict() for p in PRIORITIES}
        self.per_key: dict[str, int] = {}     # key -> tickets waiting
        self.pinned: dict[str, int] = {}      # replica -> tickets waiting for it
        self.waiting = 0

    def of_key(self, key_id: str) -> int:
        return self.per_key.get(key_id, 0)

    def add(self, ticket: Ticket) -> None:
        """``ticket`` waits, last of its key."""
        if ticket.home is not None:
            self.pinned[ticket.home] = self.pinned.get(ticket.home, 0) + 1
        self.classes[ticket.priority].setdefault(ticket.key_id, deque()).append(ticket)
        self.per_key[ticket.key_id] = self.per_key.get(ticket.key_id, 0) + 1
        self.waiting += 1

    def remove(self, ticket: Ticket, rotate: bool) -> bool:
        """Take ``ticket`` out of the queue; when it was served (``rotate``), its key's turn
        passes to the next key. False when it was not waiting."""
        queue = self.classes[ticket.priority]
        tickets = queue.get(ticket.key_id)
        if tickets is None or ticket not in tickets:
            return False
        tickets.remove(ticket)
        if not tickets:
            del queue[ticket.key_id]
        elif rotate:
            queue.move_to_end(ticket.key_id)
        if ticket.home is not None:
            left_home = self.pinned.get(ticket.home, 0) - 1
            if left_home > 0:
                self.pinned[ticket.home] = left_home
            else:
                self.pinned.pop(ticket.home, None)
        left = self.per_key[ticket.key_id] - 1
        if left:
            self.per_key[ticket.key_id] = left
        else:
            del self.per_key[ticket.key_id]
        self.waiting -= 1
        return True

    def in_order(self) -> Iterator[Ticket]:
        """Waiting tickets in order of service (the first :data:`SCAN`): by class, keys in
        turn, each key's oldest first. The caller stops at its first change."""
        seen = 0
        for priority in PRIORITIES:
            for tickets in self.classes[priority].values():
                for ticket in tickets:
                    yield ticket
                    seen += 1
                    if seen >= SCAN:
                        return

    def where(self, doomed: Callable[[Ticket], bool]) -> list[Ticket]:
        """Every waiting ticket ``doomed`` holds true of."""
        return [t for q in self.classes.values() for ts in q.values() for t in ts if doomed(t)]

    def push_out(self, key_id: str, priority: Priority) -> Ticket | None:
        """The ticket a full queue gives up for a newcomer, if any: the newest of the
        lowest class below the newcomer's, else the newest of the key holding the most
        tickets of the newcomer's class when that key holds at least two more than the
        newcomer's key. So a key that floods the queue cannot keep other keys out of it
        (they get its place, not a 429), while a queue shared evenly refuses newcomers."""
        rank = PRIORITIES.index(priority)
        for lower in reversed(PRIORITIES[rank + 1:]):
            queue = self.classes[lower]
            if queue:
                return max(queue.values(), key=len)[-1]
        queue = self.classes[priority]
        if not queue:
            return None
        heaviest = max(queue.values(), key=len)
        mine = len(queue.get(key_id, ()))
        return heaviest[-1] if len(heaviest) >= mine + 2 else None
