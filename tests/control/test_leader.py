"""Two control instances on one PostgreSQL store never both act; the other takes over
when the leader stops. The leader's pass runs without the garbage collector."""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

import pytest

from llmgw_runtime.control import reconcile
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.control.reconcile import Reconciler
from llmgw_runtime.gckeeper import Keeper
from llmgw_runtime.store import Store


@pytest.fixture
def pg_store(postgres):  # type: ignore[no-untyped-def]
    s = Store(postgres.create_database(f"leader_{time.time_ns()}"))
    s.migrate()
    yield s
    s.dispose()


def test_two_instances_never_both_lead_and_the_other_takes_over(pg_store: Store) -> None:
    config = ControlConfig(reconcile_interval_s=0.05, lease_ttl_s=0.5)
    a = Reconciler(pg_store, config, holder="a")
    b = Reconciler(pg_store, config, holder="b")
    # Each cycle that acted records (holder, start, end) of its write transaction.
    acted: list[tuple[str, float, float]] = []
    lock = threading.Lock()
    stop_a = threading.Event()
    stop_all = threading.Event()

    def loop(rec: Reconciler, stop: threading.Event) -> None:
        while not stop.is_set() and not stop_all.is_set():
            start = time.monotonic()
            led = rec.run_cycle()
            end = time.monotonic()
            if led:
                with lock:
                    acted.append((rec.holder, start, end))
            time.sleep(0.02)

    threads = [threading.Thread(target=loop, args=(a, stop_a)),
               threading.Thread(target=loop, args=(b, threading.Event()))]
    threads[0].start()
    time.sleep(0.3)          # a leads first
    threads[1].start()
    time.sleep(1.0)
    stop_a.set()             # a stops renewing (as if it died): b must take over
    threads[0].join()
    time.sleep(1.5)
    stop_all.set()
    threads[1].join()

    holders = [h for h, _, _ in acted]
    assert holders[0] == "a" and "b" in holders
    first_b = min(s for h, s, _ in acted if h == "b")
    last_a = max(e for h, _, e in acted if h == "a")
    assert first_b > last_a, "b acted while a still held the lease"
    # a renewed its lease at the start of its last cycle; it expires lease_ttl_s later
    # (a slow last cycle on a loaded machine ends closer to b's first one than that).
    last_a_renewal = max(s for h, s, _ in acted if h == "a")
    assert first_b - last_a_renewal >= 0.45, "b took over before a's lease could have expired"
    # While a was alive, b never led.
    assert all(h == "a" for h, s, _ in acted if s < last_a)


def test_a_lost_lease_is_noticed_before_writing(pg_store: Store) -> None:
    config = ControlConfig(reconcile_interval_s=0.05, lease_ttl_s=0.2)
    a = Reconciler(pg_store, config, holder="a")
    b = Reconciler(pg_store, config, holder="b")
    assert a.run_cycle()
    time.sleep(0.3)
    assert b.run_cycle()      # a's lease expired; b leads
    assert not a.run_cycle()  # a sees b's unexpired lease and does nothing
    assert b.is_leader and not a.is_leader


def test_a_reconciler_that_takes_the_lease_reads_the_whole_fleet_first(
        pg_store: Store) -> None:
    """The fleet kept in memory is not trusted across a leadership change: whatever the
    other leader wrote meanwhile, the new leader's first pass reads everything, and its
    passes after that only what changed."""
    config = ControlConfig(reconcile_interval_s=0.05, lease_ttl_s=0.2)
    a = Reconciler(pg_store, config, holder="a")
    b = Reconciler(pg_store, config, holder="b")
    assert a.run_cycle() and a.view.last_full
    assert a.run_cycle() and not a.view.last_full
    time.sleep(0.3)
    assert b.run_cycle() and b.view.last_full
    time.sleep(0.3)
    assert a.run_cycle() and a.view.last_full, "a used what it held before b led"
    assert a.run_cycle() and not a.view.last_full


def test_no_collection_stops_a_pass_and_the_keeper_ticks_between_passes(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cyclic collector never runs inside the leader's pass (a full collection there
    took 28-110 ms at 10,000 nodes): the process's keeper ticks between passes."""
    rec = Reconciler(store, ControlConfig(reconcile_interval_s=0.05, lease_ttl_s=5.0))
    rec.keeper = Keeper(freeze_every_s=0.0)
    in_pass, collections = [False], []
    original = reconcile.fleet.reconcile

    def marked(*args: Any, **kwargs: Any) -> Any:
        in_pass[0] = True
        try:
            return original(*args, **kwargs)
        finally:
            in_pass[0] = False

    def probe(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collections.append(in_pass[0])

    monkeypatch.setattr(reconcile.fleet, "reconcile", marked)
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)           # a collection at nearly every allocation
    gc.callbacks.append(probe)
    try:
        assert rec.run_cycle()
    finally:
        gc.callbacks.remove(probe)
        gc.set_threshold(*thresholds)
    assert collections and not any(collections), "a collection ran inside the pass"
    thread = rec.start()
    try:
        deadline = time.monotonic() + 10
        while rec.keeper.ticked_at is None:
            assert time.monotonic() < deadline, "the keeper never ticked"
            time.sleep(0.02)
    finally:
        rec.stop()
        thread.join(10)
        gc.unfreeze()


def test_the_minutes_history_sample_runs_below_the_passes_priority(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The history sample (a second or more of work once a minute at fleet scale) runs at
    the web workers' priority, LLMGW_WEB_NICE below the reconciler's, on a thread of its
    own; the pass's thread keeps its priority."""
    rec = Reconciler(store, ControlConfig(reconcile_interval_s=0.05, lease_ttl_s=5.0))
    samples: list[tuple[str, int]] = []

    def sample(*args: Any) -> None:
        samples.append((threading.current_thread().name,
                        os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))

    monkeypatch.setattr(rec.history, "tick", sample)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert rec.run_cycle()
    assert samples == [("llmgw-history", min(19, mine + rec.config.web_nice))]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine
