"""How often a router worker with waiting requests looks at the shared slot counts: often
(every POLL_S) only while another worker holds a slot its waiters could take; else at the
next max_wait_s expiry, at most once a second. Its own releases wake its waiters at once.
(Polling every 5 ms while a request waited cost a one-slot engine on the same two cores
about 2 % of its speed, which a queued request's first token paid for every request ahead
of it: GuideLLM measured +61 ms at concurrency 2.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from llmgw_runtime.api.router import Endpoint
from llmgw_runtime.router.admission.gate import IDLE_POLL_S, POLL_S, Gate
from llmgw_runtime.router.metrics import RouterMetrics
from llmgw_runtime.router.tables.homes import Homes
from llmgw_runtime.router.tables.slots import LocalSlots

ONE = [Endpoint(replica_id="r-1", url="http://127.0.0.1:1", slots=1)]


class OtherWorker(LocalSlots):
    """The counts as this worker sees them while another worker holds ``held`` slots."""

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[str, int] = {}

    def others(self, replica_ids: Sequence[str]) -> list[int]:
        return [self.held.get(rid, 0) for rid in replica_ids]


def _waiting(gate: Gate, max_wait_s: float) -> tuple[threading.Thread, list[object]]:
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(
        gate.admit("m", ONE, "k", "normal", None, 10, max_wait_s)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not gate.capacity().get("m") or not gate.capacity()["m"].waiting:
        assert time.monotonic() < deadline, "the second request never queued"
        time.sleep(0.01)
    return thread, got


def test_a_worker_whose_own_request_holds_the_slot_polls_at_most_once_a_second() -> None:
    gate = Gate(RouterMetrics(), counts=OtherWorker(), homes=Homes())
    lease = gate.admit("m", ONE, "k", "normal", None, 10, 30.0)
    assert lease is not None
    thread, got = _waiting(gate, 30.0)
    assert gate.poll() == IDLE_POLL_S
    lease.release()                          # its own release hands the slot over at once
    thread.join(2)
    assert got and got[0] is not None


def test_a_waiter_near_its_max_wait_is_polled_at_its_expiry() -> None:
    gate = Gate(RouterMetrics(), counts=OtherWorker(), homes=Homes())
    lease = gate.admit("m", ONE, "k", "normal", None, 10, 0.3)
    assert lease is not None
    _waiting(gate, 0.3)
    assert POLL_S <= gate.poll() <= 0.3
    lease.release()


def test_a_slot_another_worker_holds_is_looked_for_every_poll_step() -> None:
    counts = OtherWorker()
    counts.held["r-1"] = 1                   # another worker serves the one slot
    gate = Gate(RouterMetrics(), counts=counts, homes=Homes())
    thread, got = _waiting(gate, 30.0)
    assert gate.poll() == POLL_S
    counts.held["r-1"] = 0                   # ... and frees it: the next poll admits
    thread.join(2)
    assert got and got[0] is not None
