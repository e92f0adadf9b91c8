"""What a router reports of each model's load (router/admission/gate.py ``Gate.capacity``, posted
with the idle map by router/routes.py): the peak of busy slots, the oldest wait, at
capacity or not, counted over the router's workers, and which router posts."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from llmgw_runtime.api.router import Endpoint, IdleMap
from llmgw_runtime.router import routes
from llmgw_runtime.router.admission.gate import Gate
from llmgw_runtime.router.metrics import RouterMetrics
from llmgw_runtime.router.tables.slots import (
    FILE_ENV,
    LocalSlots,
    SharedSlots,
    SlotCounts,
    create_file,
)

EPS = (Endpoint(replica_id="r1", url="http://e:1", slots=3),)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def gate(counts: SlotCounts | None = None, clock: Clock | None = None) -> Gate:
    return Gate(RouterMetrics(), (1, 1), counts=counts or LocalSlots(),
                clock=clock or Clock())


def admit(g: Gate, eps: tuple[Endpoint, ...] = EPS, max_queue: int = 5) -> object:
    return g.admit("m", eps, "-", "normal", None, max_queue, 30.0)


def test_the_peak_of_busy_slots_is_reported_after_requests_ended() -> None:
    g = gate()
    leases = [admit(g), admit(g)]
    leases[0].release()                                   # type: ignore[attr-defined]
    [report] = g.capacity().values()
    assert (report.busy, report.in_flight, report.waiting) == (2, 1, 0)
    assert report.at_capacity is False and report.queued == 0
    [report] = g.capacity().values()                      # still one in flight
    assert (report.busy, report.in_flight) == (1, 1)
    leases[1].release()                                   # type: ignore[attr-defined]
    assert g.capacity() == {}      # nothing since, nothing in flight: no load to report


def test_a_request_still_waiting_reports_how_long_it_has_waited() -> None:
    clock = Clock()
    g = gate(clock=clock)
    one = (Endpoint(replica_id="r1", url="http://e:1", slots=1),)
    held = admit(g, one)
    got: list[object] = []
    waiter = threading.Thread(target=lambda: got.append(admit(g, one)))
    waiter.start()
    for _ in range(500):
        if g._cores["m"].waiting("m"):
            break
        threading.Event().wait(0.01)
    clock.now += 4.0
    [report] = g.capacity().values()
    assert report.oldest_wait_s == pytest.approx(4.0)
    assert (report.waiting, report.queued, report.busy, report.at_capacity) == (1, 1, 1, True)
    held.release()                                        # type: ignore[attr-defined]
    waiter.join(5)
    [report] = g.capacity().values()
    assert report.oldest_wait_s == 0.0 and report.wait_p90_s == pytest.approx(4.0)


def test_busy_counts_the_other_workers_requests(tmp_path: Path) -> None:
    path = create_file(str(tmp_path), workers=2)
    one, two = gate(SharedSlots(path, 0)), gate(SharedSlots(path, 1))
    assert admit(one) is not None and admit(two) is not None
    [report] = two.capacity().values()
    assert (report.busy, report.in_flight) == (2, 2)


def test_a_router_is_one_id_for_all_its_workers_and_a_new_one_at_each_start(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(FILE_ENV, raising=False)
    alone = routes.router_instance()
    assert alone == routes.router_instance()              # one process: one id
    monkeypatch.setenv(FILE_ENV, str(tmp_path / "a" / "slots"))
    first = routes.router_instance()
    assert first != alone and first == routes.router_instance()
    monkeypatch.setenv(FILE_ENV, str(tmp_path / "b" / "slots"))   # a restarted router
    assert routes.router_instance() != first
    for rid in (alone, first):                            # what the control service takes
        assert IdleMap(replicas={}, router=rid).router == rid
