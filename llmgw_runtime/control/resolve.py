"""Host names to addresses, cached: what a node's stated address is checked against
(control/identity.py ``address_problem``). One per app (``app.extensions``), so views keep
no cache of their own; the lookup is passed in (a test's fake, or the system's resolver)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from . import identity

TTL_S = 60.0              # how long a name's addresses are used before it is looked up again
LIMIT = 10_000            # names kept at most (then the cache starts afresh)


def system_lookup(name: str) -> tuple[str, ...]:
    """The addresses the system's resolver gives ``name`` (none when it gives none)."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return ()
    return tuple(sorted({str(i[4][0]) for i in infos}))


class Resolver:
    """``resolver(name)``: the addresses ``name`` resolves to, each name looked up at most
    once a ``ttl_s``; an address or nothing resolves to nothing."""

    def __init__(self, lookup: Callable[[str], tuple[str, ...]] = system_lookup,
                 clock: Callable[[], float] = time.monotonic, ttl_s: float = TTL_S,
                 limit: int = LIMIT) -> None:
        self.lookup, self.clock, self.ttl_s, self.limit = lookup, clock, ttl_s, limit
        self.cache: dict[str, tuple[float, tuple[str, ...]]] = {}

    def __call__(self, name: str) -> tuple[str, ...]:
        if not name or identity.is_ip(name):
            return ()
        now = self.clock()
        hit = self.cache.get(name)
        if hit is None or now - hit[0] > self.ttl_s:
            hit = (now, self.lookup(name))
            if len(self.cache) >= self.limit:
                self.cache.clear()
            self.cache[name] = hit
        return hit[1]
