"""Long CPU work in slices (llmgw_runtime/coop.py): a checkpoint gives the event loop its
turn once a slice's time has passed, never more often, and nothing outside a worker that
enabled it. (That a catalog's parse leaves a gevent worker's loop serving:
tests/control/test_web_worker.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from llmgw_runtime import coop


@pytest.fixture(autouse=True)
def disabled() -> Iterator[None]:
    yield
    coop.disable()


def work(seconds: float) -> int:
    """Compute for ``seconds``, calling a checkpoint as a long loop does; the calls."""
    calls = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        coop.checkpoint()
        calls += 1
    return calls


def test_the_loop_gets_a_turn_each_slice_and_no_more() -> None:
    turns: list[float] = []
    coop.enable(lambda: turns.append(time.perf_counter()))
    calls = work(12 * coop.SLICE_S)
    # thousands of checkpoints, a turn only every SLICE_S (the first slice is one)
    assert calls > 1000
    assert 2 <= len(turns) <= 13       # fewer when the machine is busy
    assert all(b - a >= coop.SLICE_S for a, b in zip(turns, turns[1:], strict=False))


def test_outside_a_worker_a_checkpoint_does_nothing() -> None:
    turns: list[float] = []
    coop.enable(lambda: turns.append(time.perf_counter()))
    coop.disable()
    work(3 * coop.SLICE_S)
    assert turns == []
