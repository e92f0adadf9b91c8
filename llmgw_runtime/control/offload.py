"""Work of a request that holds the CPU for long, off a gevent web worker's event loop.

A gevent worker (control/worker.py) serves every connection on one thread: while a
request computes, no other request of that worker is even read. Most requests compute for
well under a millisecond between their store round trips; parsing a catalog of 1,000
models computes for about 0.35 s, during which the worker's share of 10,000 agents'
reports (2,500 a second) waited, and a catalog applied every 30 s showed in their p99.
:func:`offload` runs such a function on one of gevent's native threads instead: the
interpreter's lock passes between it and the event loop every switch interval (5 ms), so
reports keep being answered while it runs. Only pure functions: nothing that waits on
the store or on a gevent primitive. Outside a patched process it just calls the
function."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def offload(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on a native thread when gevent patched this process; its result, or
    its exception raised here."""
    from gevent import monkey

    if not monkey.is_module_patched("threading"):
        return fn(*args)
    import gevent

    return gevent.get_hub().threadpool.apply(fn, args)  # type: ignore[no-any-return]
