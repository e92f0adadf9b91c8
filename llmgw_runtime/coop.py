"""Long CPU work on a gevent web worker's event loop, in slices.

A gevent worker (control/worker.py) serves every connection on one thread: while a
request computes, no other request of that worker is even read. Most requests compute for
well under a millisecond between their store round trips; a catalog apply of 1,000 models
computes for about half a second (its parse, the alias check against the stored models,
the rows it writes), and at 10,000 agents the worker's 2,500 reports a second waited for
all of it.

Handing that work to a native thread did not help: the thread and the event loop share
the interpreter's lock, and the loop gives it up at every system call (each read, each
send, each wait for the next event), then waits up to the switch interval (5 ms) to get it
back while the thread computes. Measured with 2,000 kept-alive connections at 2,500
requests a second and a 1,000-model catalog parsed every 5 s (bench/slices_bench.py,
docs/performance.md stop 44): the requests' p99 was 1.3 ms without the parse, 199 ms with
it on a native thread, 231 ms in the request's greenlet in one go, 47 ms in 5 ms slices
with the loop's turn between them (a pure 0.35 s loop in slices: 13 ms).

So long loops walk :func:`sliced` (or call :func:`checkpoint`): once :data:`SLICE_S` has
passed since the loop last had its turn, it gives the loop one turn (a sleep of
:data:`TURN_S`: the loop serves the connections that are ready, then resumes the work).
They are a catalog apply's (its parse, the stored models' alias check, its rows, the
rollout start) and the status summary's walks of the nodes, models and replicas (a
quarter of a second at 10,000 nodes, for every status view and console page).
Outside a gevent worker (the reconciler, the CLI, tests) nothing was enabled and a
checkpoint costs one comparison."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

SLICE_S = 0.005     # the most a long loop computes before the event loop gets its turn
TURN_S = 0.0001     # a timer this short: the loop polls what is ready, then resumes us

_turn: Callable[[], None] | None = None
_since = 0.0        # when the event loop last had its turn (time.perf_counter)


def enable(turn: Callable[[], None]) -> None:
    """Give the event loop its turn with ``turn`` from now on (a gevent worker, after
    gevent's patch); ``disable`` undoes it."""
    global _turn, _since
    _turn = turn
    _since = time.perf_counter()


def disable() -> None:
    global _turn
    _turn = None


def enable_gevent() -> None:
    """The turn of a gevent worker's loop: a timer of :data:`TURN_S`. (``gevent.sleep(0)``
    runs the other greenlets already switched to, not the connections whose data arrived;
    ``gevent.idle()`` never returns while the loop is never idle.)"""
    import gevent

    enable(lambda: gevent.sleep(TURN_S))


def checkpoint() -> None:
    """Give the event loop its turn when this work has computed for :data:`SLICE_S` since
    it last had one (a no-op outside a gevent worker)."""
    global _since
    turn = _turn
    if turn is None:
        return
    if time.perf_counter() - _since >= SLICE_S:
        turn()
        _since = time.perf_counter()


def sliced(items: Iterable[T]) -> Iterable[T]:
    """``items`` with a :func:`checkpoint` before each (a loop over a fleet's thousands of
    nodes); ``items`` themselves outside a gevent worker."""
    return items if _turn is None else _checked(items)


def _checked(items: Iterable[T]) -> Iterator[T]:
    for item in items:
        checkpoint()
        yield item
