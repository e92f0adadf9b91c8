"""Shared in-flight counts (router/tables/slots.py) across processes, the slot share of several
routers, and the admission shell (router/admission/gate.py) on top of them."""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.api.router import Endpoint
from llmgw_runtime.router.admission.gate import Gate
from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.router.errors import ModelAtCapacity
from llmgw_runtime.router.metrics import RouterMetrics
from llmgw_runtime.router.tables import slots
from llmgw_runtime.router.tables.slots import (
    UNLIMITED,
    LocalSlots,
    SharedSlots,
    create_file,
    model_shares,
    parse_share,
    share,
    zero_row,
)

FORK = multiprocessing.get_context("fork")


def _in_child(target: Callable[..., None], *args: object) -> None:
    proc = FORK.Process(target=target, args=args)
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0


def _hold(path: str, row: int, replica: str, count: int) -> None:
    counts = SharedSlots(path, row)
    with counts.locked():
        counts.set_mine(replica, count)


def test_another_process_sees_what_a_worker_holds_and_a_dead_row_is_zeroed(
        tmp_path: Path) -> None:
    path = create_file(str(tmp_path), workers=2)
    _in_child(_hold, path, 1, "r1", 3)
    mine = SharedSlots(path, 0)
    with mine.locked():
        mine.set_mine("r1", 2)
        assert mine.others(["r1", "r2"]) == [3, 0]
        assert mine.totals(["r1"]) == [5]
    zero_row(path, 1)                     # the master, when worker 1 exited
    with mine.locked():
        assert mine.others(["r1"]) == [0] and mine.totals(["r1"]) == [2]


def _take_and_hang(path: str, row: int, ready: Any) -> None:
    counts = SharedSlots(path, row)
    counts.locked().__enter__()
    counts.set_mine("r1", 1)
    ready.set()
    time.sleep(60)                     # killed inside the critical section


def test_a_worker_killed_holding_the_lock_frees_it_at_once_and_its_row_is_zeroed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = create_file(str(tmp_path), workers=2)
    mine = SharedSlots(path, 0)
    ready = FORK.Event()
    holder = FORK.Process(target=_take_and_hang, args=(path, 1, ready))
    holder.start()
    try:
        assert ready.wait(10)
        assert not mine._shared.try_take()          # held by the live holder
    finally:
        os.kill(holder.pid, signal.SIGKILL)         # type: ignore[arg-type]
        holder.join(10)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="llmgw_runtime.router.tables.slots"), \
            mine.locked():                            # the kernel gave it back
        assert mine.others(["r1"]) == [1]            # the dead row, until the master...
    assert time.monotonic() - started < 0.5 and not caplog.text
    zero_row(path, 1)                                # ... zeroes it (child_exit)
    with mine.locked():
        assert mine.others(["r1"]) == [0] and mine.totals(["r1"]) == [0]


def _check_then_take(path: str, row: int, slots_n: int, ready: Any, go: int) -> None:
    counts = SharedSlots(path, row)
    with counts.locked():
        free = slots_n - counts.others(["r1"])[0]    # the check: all free ...
        ready.set()
        os.read(go, 1)                               # (SIGSTOPped here)
        counts.set_mine("r1", free)                  # ... and the take


def test_a_holder_stopped_for_seconds_keeps_the_lock_and_nothing_is_over_admitted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker stopped (SIGSTOP, or starved) between its check and its take keeps the
    lock: another worker's admission waits for it rather than taking it over and
    admitting into the slots the stopped one is about to take."""
    monkeypatch.setattr(slots, "_last_warned", -slots.WARN_EVERY_S)   # warns again
    path = create_file(str(tmp_path), workers=2)
    gate = _gate(SharedSlots(path, 0))
    eps = (Endpoint(replica_id="r1", url="http://e:1", slots=2),)
    ready = FORK.Event()
    go_read, go = os.pipe()        # (an Event's set() would wait for the stopped waiter)
    holder = FORK.Process(target=_check_then_take, args=(path, 1, 2, ready, go_read))
    holder.start()
    try:
        assert ready.wait(10)
        os.kill(holder.pid, signal.SIGSTOP)          # type: ignore[arg-type]
        os.write(go, b"g")                           # read only once continued
        resume = threading.Timer(3.0, os.kill, (holder.pid, signal.SIGCONT))
        resume.start()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="llmgw_runtime.router.tables.slots"):
            try:
                lease = gate.admit("m", eps, "-", "normal", None, 0, 30.0)
            except ModelAtCapacity:                  # the holder's 2 fill both slots
                lease = None
        waited = time.monotonic() - started
        resume.join()
    finally:
        os.kill(holder.pid, signal.SIGCONT)          # type: ignore[arg-type]
        os.write(go, b"g")
        holder.join(10)
        os.close(go_read)
        os.close(go)
    assert holder.exitcode == 0
    with gate.locked():
        assert gate._counts.totals(["r1"]) == [2]    # never more than the slots
    assert lease is None
    assert 2.5 < waited < 10                         # it waited for the stopped holder
    assert "admission waits for it" in caplog.text


def _try_the_lock_of(counts: SharedSlots) -> None:
    taken = counts._shared.try_take()
    os._exit(1 if taken else 0)


def test_the_lock_excludes_each_opening_of_the_file_also_across_fork(
        tmp_path: Path) -> None:
    path = create_file(str(tmp_path), workers=2)
    one, two = SharedSlots(path, 0), SharedSlots(path, 1)
    with one.locked():
        assert not two._shared.try_take()          # same process, another opening
        _in_child(_try_the_lock_of, one)           # forked: its own description
    assert two._shared.try_take()
    two._shared.give()


def _hold_for(path: str, row: int, held_s: float, ready: Any) -> None:
    counts = SharedSlots(path, row)
    with counts.locked():
        ready.set()
        time.sleep(held_s)             # a holder the kernel took the CPU from, say


def test_a_worker_waiting_for_the_lock_sleeps_rather_than_spinning(tmp_path: Path) -> None:
    """While another process holds the lock, a waiting worker tries again after real
    sleeps (after a few yields), not once per turn of its event loop: spinning would
    take the CPU its holder needs to give the lock back."""
    path = create_file(str(tmp_path), workers=2)
    mine = SharedSlots(path, 0)
    ready = FORK.Event()
    holder = FORK.Process(target=_hold_for, args=(path, 1, 0.3, ready))
    holder.start()
    try:
        assert ready.wait(10)
        tries = 0
        real = mine._shared.try_take

        def counting() -> bool:
            nonlocal tries
            tries += 1
            return real()

        mine._shared.try_take = counting           # type: ignore[method-assign]
        started = time.monotonic()
        with mine.locked():
            waited = time.monotonic() - started
        assert 0.1 < waited < 1.0
        backoff = math.log2(slots.MAX_BACKOFF_S / slots.BACKOFF_S) + 1
        assert tries <= slots.SPINS + backoff + waited / slots.MAX_BACKOFF_S + 2
    finally:
        holder.join(10)


_GEVENT_WAIT = """
from gevent import monkey; monkey.patch_all()
import gevent, multiprocessing, sys, time
from llmgw_runtime.router.tables.slots import SharedSlots
path = sys.argv[1]
mine = SharedSlots(path, 0)

def hold(ready):
    with SharedSlots(path, 1).locked():
        ready.set()
        time.sleep(0.5)

ctx = multiprocessing.get_context("fork")
ready = ctx.Event()
holder = ctx.Process(target=hold, args=(ready,))
holder.start()
assert ready.wait(10)
ticks = 0
def tick():
    global ticks
    while True:
        ticks += 1
        gevent.sleep(0.01)
gevent.spawn(tick)
started = time.monotonic()
def wait():
    with mine.locked():
        pass
gevent.spawn(wait).join()
holder.join(10)
print(round(time.monotonic() - started, 2), ticks)
"""


def test_a_gevent_worker_waiting_for_the_lock_keeps_serving_its_other_greenlets(
        tmp_path: Path) -> None:
    path = create_file(str(tmp_path), workers=2)
    done = subprocess.run([sys.executable, "-c", _GEVENT_WAIT, path], capture_output=True,
                          text=True, timeout=60, check=True)
    waited, ticks = done.stdout.split()
    assert float(waited) >= 0.4 and int(ticks) >= 10    # ~50 (10 ms apart); 1 if blocked


def _take_and_give_back(path: str, row: int, limit: int, rounds: int,
                        seen: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    counts = SharedSlots(path, row)
    held, worst = 0, 0
    for i in range(rounds):
        with counts.locked():
            if i % 3 == 2 and held:
                held -= 1
            elif counts.others(["r"])[0] + held < limit:
                held += 1
            counts.set_mine("r", held)
            worst = max(worst, counts.totals(["r"])[0])
    seen.put(worst)


def test_check_and_take_under_the_lock_never_exceeds_the_slots_across_processes(
        tmp_path: Path) -> None:
    path = create_file(str(tmp_path), workers=3)
    seen = FORK.Queue()
    procs = [FORK.Process(target=_take_and_give_back, args=(path, row, 4, 3000, seen))
             for row in range(3)]
    for p in procs:
        p.start()
    worst = [seen.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert max(worst) == 4


def test_columns_of_replicas_gone_from_the_table_are_reused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slots, "COLUMNS", 2)
    counts = SharedSlots(create_file(str(tmp_path), workers=1), 0)
    with counts.locked():
        counts.set_mine("a", 1)
        counts.set_mine("b", 0)       # 0 takes no column
        counts.set_mine("b", 1)
        counts.set_mine("c", 1)       # full: not counted
        assert counts.totals(["a", "b", "c"]) == [1, 1, 0]
        counts.set_mine("a", 0)
    counts.forget_except({"b", "c"})
    with counts.locked():
        counts.set_mine("c", 1)       # takes a's column (a left, nothing in flight)
        assert counts.totals(["a", "b", "c"]) == [0, 1, 1]


def test_several_routers_split_a_replicas_slots_and_spread_the_remainders() -> None:
    for total in range(0, 12):
        for routers in range(1, 5):
            for rid in ("r1", "r2", "r3"):
                parts = [share(total, rid, i, routers) for i in range(1, routers + 1)]
                assert sum(parts) == total
                assert max(parts) - min(parts) <= 1
    # 3 slots over 2 routers: the extra one does not always go to the same router
    extra = {max(range(1, 3), key=lambda i: share(3, f"r{n}", i, 2)) for n in range(20)}
    assert extra == {1, 2}


def test_a_model_left_without_slots_by_its_share_still_gets_one() -> None:
    routers = [model_shares({"r1": 1, "r2": 1}, i, 4) for i in range(1, 5)]
    assert all(sum(s.values()) >= 1 for s in routers)   # each router serves the model
    assert model_shares({"r1": None}, 2, 3) == {"r1": UNLIMITED}
    assert model_shares({}, 1, 1) == {}


def test_slot_share_is_validated_with_what_to_set() -> None:
    assert parse_share("2/3") == (2, 3)
    for bad in ("2", "0/1", "3/2", "a/b", ""):
        with pytest.raises(ValueError, match="I/N|1 <= I <= N"):
            parse_share(bad)
    problems = RouterConfig(control_url="http://c:1", router_token="t",
                            slot_share="3/2").validate()
    assert any("LLMGW_SLOT_SHARE" in p for p in problems)


def _gate(counts: slots.SlotCounts, share_parts: tuple[int, int] = (1, 1)) -> Gate:
    return Gate(RouterMetrics(), share_parts, counts=counts, clock=lambda: 1.0)


def test_two_workers_gates_never_exceed_a_replicas_slots_together(tmp_path: Path) -> None:
    path = create_file(str(tmp_path), workers=2)
    one, two = _gate(SharedSlots(path, 0)), _gate(SharedSlots(path, 1))
    eps = (Endpoint(replica_id="r1", url="http://e:1", slots=2),)
    args = ("m", eps, "-", "normal", None, 0, 30.0)
    held = [one.admit(*args), two.admit(*args)]          # type: ignore[arg-type]
    assert all(lease is not None for lease in held)
    with pytest.raises(ModelAtCapacity) as info:
        one.admit(*args)                                 # type: ignore[arg-type]
    assert info.value.status == 429 and "max_queue 0" in info.value.message
    held[1].release()                                    # type: ignore[union-attr]
    held[1].release()                                    # type: ignore[union-attr]  # once
    lease = one.admit(*args)                             # type: ignore[arg-type]
    assert lease is not None and lease.endpoint.replica_id == "r1"


def test_unknown_slots_never_limit_and_no_replica_asks_the_caller_to_wait() -> None:
    gate = _gate(LocalSlots())
    eps = (Endpoint(replica_id="r1", url="http://e:1", slots=None),)
    leases = [gate.admit("m", eps, "-", "normal", None, 0, 30.0) for _ in range(50)]
    assert all(lease is not None for lease in leases)
    assert gate.admit("m", (), "-", "normal", None, 0, 30.0) is None


class _Control:
    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, float], dict[str, object] | None]] = []

    def get_routes(self) -> dict[str, object]:
        return {"models": []}

    def post_idle(self, replicas: dict[str, float],
                  capacity: dict[str, object] | None = None) -> None:
        self.posts.append((replicas, capacity))


def test_capacity_and_load_are_reported_each_interval_even_with_no_idle_map() -> None:
    from llmgw_runtime.api.router import ModelCapacity
    from llmgw_runtime.router.routes import RoutesCache

    gate = _gate(LocalSlots())
    eps = (Endpoint(replica_id="r1", url="http://e:1", slots=1),)
    assert gate.admit("m", eps, "-", "normal", None, 0, 30.0) is not None
    with pytest.raises(ModelAtCapacity):
        gate.admit("m", eps, "-", "normal", None, 0, 30.0)
    control = _Control()
    cache = RoutesCache(control, 1.0, dict, capacity=gate.capacity)  # type: ignore[arg-type]
    cache.tick()
    cache.tick()                      # still in flight since: load, not at capacity
    assert control.posts == [
        ({}, {"m": ModelCapacity(waiting=0, in_flight=1, slots=1, rejected=1, wait_p90_s=0.0,
                                 busy=1, at_capacity=True)}),
        ({}, {"m": ModelCapacity(waiting=0, in_flight=1, slots=1, rejected=0, wait_p90_s=0.0,
                                 busy=1, at_capacity=False)})]


def test_the_queue_bound_is_the_routers_not_each_workers(tmp_path: Path) -> None:
    import threading

    path = create_file(str(tmp_path), workers=2)
    one, two = _gate(SharedSlots(path, 0)), _gate(SharedSlots(path, 1))
    eps = (Endpoint(replica_id="r1", url="http://e:1", slots=1),)
    args = ("m", eps, "-", "normal", None, 1, 30.0)
    held = one.admit(*args)                              # type: ignore[arg-type]
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(one.admit(*args)))  # type: ignore[arg-type]
    waiter.start()                                       # waits in worker one's queue
    for _ in range(200):
        if one._cores["m"].waiting("m"):
            break
        threading.Event().wait(0.01)
    with pytest.raises(ModelAtCapacity) as info:         # worker two: the queue is full
        two.admit(*args)                                 # type: ignore[arg-type]
    assert "max_queue 1" in info.value.message and "1 request waits" in info.value.message
    held.release()                                       # type: ignore[union-attr]
    waiter.join(5)
    assert got and got[0] is not None
