"""Slot admission and the fair queue (router/admission/core.py): a pure core, driven here by
hand with ``now`` passed in."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from llmgw_runtime.router.admission.core import (
    RETRY_AFTER_MAX_S,
    Admission,
    Admitted,
    Decision,
    Priority,
    Queued,
    Rejected,
    Ticket,
)

TWO = {"r1": 2, "r2": 2}     # two replicas, two slots each


class Shell:
    """A stand-in for the waiting shell: records every ticket the core decided later."""

    def __init__(self, **settings: Any) -> None:
        self.woken: list[Ticket] = []
        self.core = Admission(on_decided=self.woken.append, **settings)

    def admit(self, key: str = "k", priority: Priority = "normal", now: float = 0.0,
              replicas: dict[str, int] | None = None, model: str = "m",
              prefix: bytes | None = None) -> Decision:
        return self.core.try_admit(model, key, priority, TWO if replicas is None else replicas,
                                   now, prefix)

    def queue(self, key: str = "k", priority: Priority = "normal", now: float = 0.0,
              replicas: dict[str, int] | None = None, model: str = "m",
              prefix: bytes | None = None) -> Ticket:
        decision = self.admit(key, priority, now, replicas, model, prefix)
        assert isinstance(decision, Queued), decision
        return decision.ticket

    def fill(self, replicas: dict[str, int] = TWO, model: str = "m") -> list[str]:
        """Take every slot; the replicas admitted to, in order."""
        taken = []
        for _ in range(sum(replicas.values())):
            decision = self.admit("filler", replicas=replicas, model=model)
            assert isinstance(decision, Admitted)
            taken.append(decision.replica)
        return taken


def served_keys(shell: Shell, replica: str, releases: int, now: float = 1.0) -> list[str]:
    """Release ``replica`` that many times; the keys of the tickets admitted, in order."""
    keys = []
    for _ in range(releases):
        for ticket in shell.core.release(replica, now):
            assert isinstance(ticket.outcome, Admitted)
            keys.append(ticket.key_id)
            replica = ticket.outcome.replica
    return keys


# -- slots ------------------------------------------------------------------------------

def test_admits_up_to_the_slots_then_queues() -> None:
    shell = Shell()
    assert sorted(shell.fill()) == ["r1", "r1", "r2", "r2"]
    assert isinstance(shell.admit(), Queued)
    assert (shell.core.in_flight("r1"), shell.core.in_flight("r2")) == (2, 2)
    assert shell.core.waiting("m") == 1


def test_without_a_prefix_the_replica_with_most_free_slots_is_taken() -> None:
    shell = Shell()
    replicas = {"small": 1, "big": 3}
    assert [shell.admit(replicas=replicas) for _ in range(3)] == \
        [Admitted("big"), Admitted("big"), Admitted("small")]


def test_a_released_slot_goes_to_the_next_ticket_at_that_replica() -> None:
    shell = Shell()
    shell.fill()
    ticket = shell.queue()
    assert shell.core.release("r2", now=1.0) == [ticket]
    assert ticket.outcome == Admitted("r2") and shell.woken == [ticket]
    assert shell.core.in_flight("r2") == 2 and shell.core.waiting("m") == 0


def test_never_more_in_flight_than_slots_and_never_a_free_slot_while_tickets_wait() -> None:
    """Random admissions, releases, cancels, expiries and replica-set changes; tickets
    with a prefix wait for their home replica for a while, the others take any slot."""
    rng = random.Random(16)
    shell = Shell(max_queue=30, max_wait_s=5.0)
    slots = {"r1": 3, "r2": 1, "r3": 2}
    running: list[str] = []           # replicas of requests admitted and not yet released
    waiting: list[Ticket] = []
    now = 0.0
    outcomes: Counter[str] = Counter()

    for _ in range(6000):
        now += rng.random() * 0.2
        op = rng.random()
        admitted_to: list[str] = []
        if op < 0.5:
            decision = shell.admit(rng.choice("abcde"), rng.choice(("high", "normal", "low")),
                                   now, slots, prefix=rng.choice([None, b"p1", b"p2"]))
            outcomes[type(decision).__name__] += 1
            if isinstance(decision, Admitted):
                admitted_to.append(decision.replica)
            elif isinstance(decision, Queued):
                waiting.append(decision.ticket)
        elif op < 0.85 and running:
            replica = running.pop(rng.randrange(len(running)))
            shell.core.release(replica, now, service_s=rng.random())
        elif op < 0.93 and waiting:
            ticket = rng.choice(waiting)
            shell.core.cancel(ticket, now)
            waiting.remove(ticket)
        elif op < 0.97:
            shell.core.expire(now)
        else:
            names = [r for r in ("r1", "r2", "r3", "r4") if rng.random() < 0.7]
            slots = {r: rng.randint(1, 3) for r in names}
            shell.core.update("m", slots, now)
        shell.core.expire(now)       # the shell's poll, every few ms while tickets wait
        for t in shell.woken:        # what the shell does with each ticket decided later
            waiting.remove(t)
            outcomes[type(t.outcome).__name__] += 1
            if isinstance(t.outcome, Admitted):
                admitted_to.append(t.outcome.replica)
        shell.woken.clear()
        running += admitted_to
        counts = Counter(running)
        for replica in {"r1", "r2", "r3", "r4"}:
            assert shell.core.in_flight(replica) == counts[replica]
        for replica in admitted_to:
            assert counts[replica] <= slots[replica]
        free = any(counts[r] < n for r, n in slots.items())

        # A waiting ticket may take a free slot: at its home replica while it waits for
        # that one, anywhere after.
        may_take = [counts[t.home] < slots[t.home]
                    if t.home is not None and now < t.spill_at and t.home in slots else free
                    for t in waiting]
        assert not any(may_take), "a slot idles while a ticket may take it"
        assert shell.core.waiting("m") == len(waiting) <= 30
        assert all(t.outcome is None for t in waiting)
    assert min(outcomes.values()) > 100, outcomes   # every path was taken


# -- order of service -----------------------------------------------------------------

def test_first_come_first_served_within_a_key() -> None:
    shell = Shell()
    shell.fill()
    tickets = [shell.queue("a", now=float(i)) for i in range(5)]
    decided = [t for _ in range(5) for t in shell.core.release("r1", now=5.0)]
    assert decided == tickets


def test_a_light_key_is_not_stuck_behind_a_heavy_one() -> None:
    shell = Shell()
    shell.fill()
    for _ in range(20):
        shell.queue("a")
    shell.queue("b")
    shell.queue("b")
    order = served_keys(shell, "r1", 6)
    assert order[:4] == ["a", "b", "a", "b"]
    assert order[4:] == ["a", "a"]


def test_keys_take_turns_round_robin() -> None:
    shell = Shell()
    shell.fill()
    for key in "aaaabbbcc":
        shell.queue(key)
    assert "".join(served_keys(shell, "r1", 9)) == "abcabcaba"


def test_a_key_that_comes_back_joins_the_end_of_the_round() -> None:
    shell = Shell()
    shell.fill()
    shell.queue("a")
    shell.queue("b")
    shell.queue("b")
    assert served_keys(shell, "r1", 1) == ["a"]
    shell.queue("c")
    shell.queue("a")
    assert "".join(served_keys(shell, "r1", 4)) == "bcab"


def test_higher_priority_classes_are_served_first() -> None:
    shell = Shell()
    shell.fill()
    shell.queue("a", "low")
    shell.queue("b", "normal")
    shell.queue("c", "high")
    shell.queue("d", "normal")
    assert served_keys(shell, "r1", 4) == ["c", "b", "d", "a"]


# -- refusals ---------------------------------------------------------------------------

def test_a_full_queue_refuses_with_queue_full_and_a_retry_after() -> None:
    shell = Shell(max_queue=3)
    shell.fill()
    for key in ("a", "b", "c"):
        shell.queue(key)
    for key in ("a", "d"):      # shared evenly: a newcomer of any key is refused
        refused = shell.admit(key)
        assert isinstance(refused, Rejected) and refused.reason == "queue_full"
        assert refused.retry_after_s >= 1
    assert shell.woken == []


def test_a_key_flooding_a_full_queue_gives_its_newest_place_to_another_key() -> None:
    shell = Shell(max_queue=4)
    shell.fill()
    flood = [shell.queue("flood", now=float(i)) for i in range(4)]
    assert isinstance(shell.admit("flood"), Rejected)
    polite = shell.admit("polite", now=5.0)
    assert isinstance(polite, Queued)
    assert shell.woken == [flood[-1]] and flood[-1].outcome == Rejected(
        "queue_full", flood[-1].outcome.retry_after_s)  # type: ignore[union-attr]
    assert shell.core.waiting("m") == 4
    assert isinstance(shell.admit("polite", now=6.0), Queued)    # 3 against 1: one more
    assert shell.woken[-1] is flood[-2]
    # 2 and 2: even, so neither key may push the other out any more.
    for key in ("polite", "flood"):
        assert isinstance(shell.admit(key, now=7.0), Rejected)
    assert len(shell.woken) == 2


def test_a_higher_class_takes_the_place_of_a_lower_one_in_a_full_queue() -> None:
    shell = Shell(max_queue=2)
    shell.fill()
    low = [shell.queue("bulk", "low", now=0.0), shell.queue("bulk", "low", now=1.0)]
    assert isinstance(shell.admit("vip", "high", now=2.0), Queued)
    assert shell.woken == [low[1]]
    assert isinstance(shell.admit("batch", "low", now=3.0), Rejected)


def test_a_key_may_hold_only_its_share_of_the_queue() -> None:
    shell = Shell(max_queue=10, max_queue_per_key=2)
    shell.fill()
    shell.queue("a")
    shell.queue("a")
    refused = shell.admit("a")
    assert isinstance(refused, Rejected) and refused.reason == "queue_full"
    assert isinstance(shell.admit("b"), Queued)


def test_no_queue_at_all_refuses_as_soon_as_the_slots_are_taken() -> None:
    shell = Shell(max_queue=0)
    shell.fill()
    assert shell.admit() == Rejected("queue_full", 1)


def test_tickets_past_max_wait_are_refused_with_timeout() -> None:
    shell = Shell(max_wait_s=10.0)
    shell.fill()
    early, late = shell.queue("a", now=0.0), shell.queue("b", now=5.0)
    assert shell.core.expire(9.9) == []
    assert shell.core.expire(10.0) == [early]
    assert isinstance(early.outcome, Rejected) and early.outcome.reason == "timeout"
    assert shell.woken == [early] and shell.core.waiting("m") == 1
    assert shell.core.release("r1", now=11.0) == [late]


def test_an_overdue_ticket_never_gets_a_slot() -> None:
    shell = Shell(max_wait_s=10.0)
    shell.fill()
    overdue, fresh = shell.queue("a", now=0.0), shell.queue("b", now=8.0)
    assert shell.core.release("r1", now=12.0) == [overdue, fresh]
    assert isinstance(overdue.outcome, Rejected) and overdue.outcome.reason == "timeout"
    assert fresh.outcome == Admitted("r1")


def test_a_full_queue_first_drops_overdue_tickets() -> None:
    shell = Shell(max_queue=1, max_wait_s=10.0)
    shell.fill()
    old = shell.queue("a", now=0.0)
    assert isinstance(shell.admit("b", now=20.0), Queued)
    assert isinstance(old.outcome, Rejected) and shell.woken == [old]


def test_a_model_with_no_replica_is_refused_with_no_replicas() -> None:
    shell = Shell()
    assert shell.admit(replicas={}) == Rejected("no_replicas", 1)


def test_retry_after_follows_service_times_and_the_queue_and_is_capped() -> None:
    shell = Shell(max_queue=4)
    shell.fill()
    for _ in range(4):
        shell.queue()
    first = shell.admit()
    for _ in range(30):        # slow requests: each release lets a ticket in, refill
        shell.core.release("r1", now=1.0, service_s=20.0)
        shell.queue()
    slow = shell.admit()
    assert isinstance(first, Rejected) and isinstance(slow, Rejected)
    assert 1 <= first.retry_after_s < slow.retry_after_s <= RETRY_AFTER_MAX_S


# -- cancel -------------------------------------------------------------------------------

def test_a_cancelled_ticket_leaves_the_queue_at_once() -> None:
    shell = Shell()
    shell.fill()
    gone, stays = shell.queue("a"), shell.queue("b")
    assert shell.core.cancel(gone, now=1.0) == []
    assert shell.core.waiting("m") == 1 and gone.outcome is None and gone.cancelled
    assert shell.core.release("r1", now=2.0) == [stays]
    assert shell.core.cancel(gone, now=3.0) == []


def test_cancelling_an_admitted_ticket_gives_its_slot_back_once() -> None:
    shell = Shell()
    shell.fill()
    granted, next_one = shell.queue("a"), shell.queue("b")
    shell.core.release("r1", now=1.0)
    assert granted.outcome == Admitted("r1")
    assert shell.core.cancel(granted, now=2.0) == [next_one]
    assert shell.core.cancel(granted, now=3.0) == []
    assert shell.core.in_flight("r1") == 2


def test_cancelling_the_head_does_not_cost_its_key_the_turn() -> None:
    shell = Shell()
    shell.fill()
    head = shell.queue("a")
    shell.queue("a")
    shell.queue("b")
    shell.core.cancel(head, now=1.0)
    assert served_keys(shell, "r1", 2) == ["a", "b"]


# -- replicas and slots that change ---------------------------------------------------

def test_a_new_replica_takes_waiting_tickets_at_once() -> None:
    shell = Shell()
    shell.fill()
    tickets = [shell.queue(key) for key in "abc"]
    decided = shell.core.update("m", {**TWO, "r3": 2}, now=1.0)
    assert decided == tickets[:2] and shell.woken == tickets[:2]
    assert all(t.outcome == Admitted("r3") for t in decided)
    assert shell.core.waiting("m") == 1


def test_a_new_replica_in_a_request_wakes_waiting_tickets_too() -> None:
    shell = Shell()
    shell.fill()
    waiting = shell.queue("a")
    decision = shell.admit("b", replicas={**TWO, "r3": 1})
    assert isinstance(decision, Queued)     # r3's one slot went to the ticket already waiting
    assert waiting.outcome == Admitted("r3") and shell.woken == [waiting]


def test_more_slots_on_a_replica_serve_waiting_tickets() -> None:
    shell = Shell()
    shell.fill()
    ticket = shell.queue()
    assert shell.core.update("m", {"r1": 3, "r2": 2}, now=1.0) == [ticket]
    assert ticket.outcome == Admitted("r1")


def test_a_removed_replica_drains_and_its_slot_is_not_handed_on() -> None:
    shell = Shell()
    shell.fill()
    ticket = shell.queue()
    shell.core.update("m", {"r1": 2}, now=1.0)
    assert shell.core.release("r2", now=2.0) == [] and ticket.outcome is None
    assert shell.core.in_flight("r2") == 1
    assert shell.core.release("r1", now=3.0) == [ticket]


def test_a_replica_listed_again_keeps_the_count_of_what_it_still_serves() -> None:
    shell = Shell()
    shell.fill()
    shell.core.update("m", {"r1": 2}, now=1.0)
    shell.core.update("m", TWO, now=2.0)
    assert shell.core.in_flight("r2") == 2
    assert isinstance(shell.admit(), Queued)


def test_slots_that_shrink_admit_nothing_there_until_it_drains() -> None:
    shell = Shell()
    shell.fill()
    small = {"r1": 1, "r2": 2}
    ticket = shell.queue(replicas=small)
    assert shell.core.release("r1", now=1.0) == []          # 1 in flight, 1 slot: full
    assert shell.core.release("r1", now=2.0) == [ticket]    # now there is room
    assert shell.core.in_flight("r1") == 1


def test_when_every_replica_is_gone_waiting_tickets_are_refused() -> None:
    shell = Shell()
    shell.fill()
    tickets = [shell.queue(key) for key in "ab"]
    assert shell.core.update("m", {}, now=1.0) == tickets
    assert all(isinstance(t.outcome, Rejected) and t.outcome.reason == "no_replicas"
               for t in tickets)
    assert shell.core.waiting("m") == 0


def test_an_unchanged_replica_set_changes_nothing() -> None:
    shell = Shell()
    shell.fill()
    shell.queue()
    assert shell.core.update("m", dict(TWO), now=1.0) == []


def test_models_queue_independently() -> None:
    shell = Shell(max_queue=1)
    shell.fill(model="m")
    shell.queue(model="m")
    assert shell.admit(model="other", replicas={"o1": 1}) == Admitted("o1")
    assert isinstance(shell.admit(model="other", replicas={"o1": 1}), Queued)
    assert shell.core.release("o1", now=1.0)[0].model == "other"


# -- arguments ----------------------------------------------------------------------------

def test_bad_arguments_are_refused() -> None:
    shell = Shell()
    with pytest.raises(ValueError, match="priority"):
        shell.admit(priority="urgent")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 0"):
        shell.admit(replicas={"r1": -1})
    assert isinstance(shell.admit(replicas={"r1": 0}), Queued)   # listed, no room now
    with pytest.raises(ValueError):
        Admission(max_wait_s=0)
