"""Slowing down guesses: failed token checks and logins counted per client address.

Pure: no clock reads (``now`` is passed in), no I/O. After ``policy.free`` failures from
one address, each further failure refuses that address for a growing delay (``first_delay_s``
doubling up to ``max_delay_s``); while refused, every attempt from it is answered 429 with
Retry-After *before* its token is checked (else guessing would go on at full speed). A
success forgets the address; so does ``window_s`` of quiet after its last refusal ended.

Memory is bounded: at most ``max_addresses`` addresses are remembered, least recently seen
dropped first. The state lives in one process (each gunicorn worker keeps its own), so with
W workers an address gets up to W times the free failures before every worker refuses it.
The address is the TCP peer (``request.remote_addr``): X-Forwarded-For is not trusted, so
behind a proxy or NAT every client of that address shares one count.

The control service counts per address *and kind of token presented* (:func:`key`: the
kind its prefix names, ``llmgw-admin-`` ..., or ``other``), so wrong admin tokens refuse
further admin tokens from that address, the right one included (else a guess that is
right would be told at full speed), while the routers and agents on the same address go
on with their own credentials (docs/security.md).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from .errors import LlmgwError
from .security import PREFIXES

OTHER = "other"                 # a token without one of llmgw's prefixes


@dataclass(frozen=True)
class Policy:
    free: int = 10                 # failures allowed before the first refusal
    first_delay_s: float = 2.0     # the first refusal; each further failure doubles it
    max_delay_s: float = 300.0
    window_s: float = 900.0        # quiet this long after a refusal ends: forgotten
    max_addresses: int = 10_000

    def delay_s(self, failures: int) -> float:
        """How long the ``failures``-th failure in a row refuses its address (0: not)."""
        over = failures - self.free
        if over <= 0:
            return 0.0
        return min(self.max_delay_s, self.first_delay_s * 2.0 ** min(over - 1, 60))


# The control service: admin, router, join and node tokens and console logins.
CONTROL = Policy()
# The router: API keys. Many clients may share one address (a NAT, a proxy), so more
# failures are free and the refusals are shorter.
ROUTER = Policy(free=30, first_delay_s=1.0, max_delay_s=60.0, window_s=600.0)


@dataclass
class _Entry:
    failures: int = 0
    last: float = 0.0              # the last failure
    until: float = 0.0             # refused until then


class Throttle:
    """Failures per address; thread-safe (gthread workers share one per process)."""

    def __init__(self, policy: Policy = CONTROL) -> None:
        self.policy = policy
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def _live(self, address: str, now: float) -> _Entry | None:
        entry = self._entries.get(address)
        if entry is not None and now - max(entry.last, entry.until) >= self.policy.window_s:
            del self._entries[address]
            return None
        return entry

    def wait_s(self, address: str, now: float) -> float:
        """Seconds ``address`` must wait before it may try again; 0 when it may now."""
        with self._lock:
            entry = self._live(address, now)
            return max(0.0, entry.until - now) if entry is not None else 0.0

    def failed(self, address: str, now: float) -> float:
        """Count a failure of ``address``; the refusal it earns now (0 while still free)."""
        with self._lock:
            entry = self._live(address, now)
            if entry is None:
                entry = self._entries[address] = _Entry()
                while len(self._entries) > self.policy.max_addresses:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(address)
            entry.failures += 1
            entry.last = now
            delay = self.policy.delay_s(entry.failures)
            entry.until = max(entry.until, now + delay) if delay else entry.until
            return delay

    def succeeded(self, address: str) -> None:
        """A right token or login: forget the address's failures."""
        if address in self._entries:
            with self._lock:
                self._entries.pop(address, None)


def kind_of(token: str) -> str:
    """The kind of token ``token`` says it is by its prefix (admin, join, router, node,
    api_key), or ``other`` (an operator-chosen token without a prefix)."""
    return next((kind for kind, prefix in PREFIXES.items() if token.startswith(prefix)),
                OTHER)


def key(address: str, token: str) -> str:
    """What the control service counts failures by: the address and the presented token's
    kind, so failures of one kind never refuse a credential of another."""
    return f"{address} {kind_of(token)}"


def retry_after(wait_s: float) -> str:
    """The Retry-After header value: whole seconds, at least 1."""
    return str(max(1, math.ceil(wait_s)))


def of(extensions: MutableMapping[str, Any], key: str = "llmgw.auth_throttle",
       policy: Policy = CONTROL) -> Throttle:
    """The throttle kept in an app's ``extensions`` (one per app, so per worker process)."""
    found = extensions.get(key)
    if found is None:
        found = extensions.setdefault(key, Throttle(policy))
    return found  # type: ignore[no-any-return]


class TooManyFailures(LlmgwError):
    """Answered 429 (with Retry-After) to an address after repeated failed token checks."""

    status = 429
    reason = "too_many_failures"

    def __init__(self, wait_s: float, what: str = "token checks") -> None:
        self.wait_s = wait_s
        super().__init__(
            f"too many failed {what} from your address; try again in "
            f"{retry_after(wait_s)} s with the right token (failures are counted per "
            "address and forgotten after a quiet while)")
