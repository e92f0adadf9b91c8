"""Remembered homes of prefixes (router/tables/homes.py) and how admission uses them: a new
conversation goes to the least-loaded replica, its later turns follow it there from any
worker, and a conversation moved by load is remembered where it moved."""

from __future__ import annotations

import hashlib
from pathlib import Path

from llmgw_runtime.router.admission.affinity import choose
from llmgw_runtime.router.admission.core import Admitted, Queued
from llmgw_runtime.router.tables import homes
from llmgw_runtime.router.tables.homes import Homes

from .test_admission import Shell


def _key(n: int) -> bytes:
    return hashlib.sha256(b"conversation %d" % n).digest()[:16]


def test_two_workers_mapping_one_file_see_each_others_homes(tmp_path: Path) -> None:
    path = homes.create_file(str(tmp_path))
    first, second = Homes(path), Homes(path)
    first.put(_key(1), "r2", now=1.0)
    assert second.get(_key(1), ["r1", "r2"]) == "r2"
    # a home that left the replicas is not one
    assert second.get(_key(1), ["r1", "r3"]) is None
    assert second.get(_key(2), ["r1", "r2"]) is None
    second.put(_key(1), "r1", now=2.0)
    assert first.get(_key(1), ["r1", "r2"]) == "r1"


def test_a_full_set_forgets_its_least_recently_served_prefix() -> None:
    table = Homes()
    same_set = [bytes([i]) * 8 + b"\0\0\0\0" + bytes(4) for i in range(1, homes.WAYS + 2)]
    for i, key in enumerate(same_set[:-1]):
        table.put(key, "r1", now=float(i))
    table.put(same_set[0], "r1", now=10.0)         # served again: the newest
    table.put(same_set[-1], "r2", now=11.0)        # a new one takes the oldest's place
    assert table.get(same_set[1], ["r1", "r2"]) is None
    assert table.get(same_set[0], ["r1", "r2"]) == "r1"
    assert table.get(same_set[-1], ["r1", "r2"]) == "r2"


def _remembering(**settings: float) -> Shell:
    shell = Shell(**settings)
    shell.core.homes = Homes()
    return shell


def test_a_new_conversation_goes_to_the_least_loaded_replica_not_its_hash() -> None:
    shell = _remembering()
    key = _key(7)
    hashed = choose(key, ["r1", "r2"], {})
    other = "r2" if hashed == "r1" else "r1"
    for _ in range(2):      # two requests without a prefix run at its hashed replica
        assert shell.core.try_admit("m", "busy", "normal", {hashed: 2, other: 0}, 0.0,
                                    None) == Admitted(hashed)
    assert shell.admit("a", prefix=key) == Admitted(other)
    # its later turns follow it there, also once the loads are even again
    for _ in range(2):
        shell.core.release(hashed, now=1.0)
    assert shell.admit("a", now=2.0, prefix=key) == Admitted(other)


def test_with_even_loads_a_new_conversation_goes_where_its_hash_says() -> None:
    shell = _remembering()
    key = _key(3)
    assert shell.admit("a", prefix=key) == Admitted(choose(key, ["r1", "r2"], {}))


def test_a_conversation_that_spilled_is_remembered_where_it_ran() -> None:
    shell = _remembering(max_wait_s=30.0)
    key = _key(11)
    home = choose(key, ["r1", "r2"], {})
    other = "r2" if home == "r1" else "r1"
    assert shell.admit("a", prefix=key) == Admitted(home)
    while shell.core.in_flight(home) < 2:          # the home fills up
        shell.core.try_admit("m", "filler", "normal", {home: 2, other: 0}, 0.0, None)
    waiting = shell.admit("a", now=1.0, prefix=key)
    assert isinstance(waiting, Queued) and waiting.ticket.home == home
    shell.core.expire(now=waiting.ticket.spill_at)      # its wait for the home is over
    assert waiting.ticket.outcome == Admitted(other)
    # its next turn goes where its cache now is, though the home has room again
    for rid in (home, home, other):
        shell.core.release(rid, now=50.0)
    assert shell.admit("a", now=50.0, prefix=key) == Admitted(other)


def test_twelve_conversations_on_two_replicas_split_evenly() -> None:
    """What hashing alone gets wrong (a 4/8 split is common): first turns placed by load,
    one at a time as they arrive, each ending before the next begins, but the replicas
    hold each conversation's growing load."""
    shell = _remembering()
    placed = {"r1": 0, "r2": 0}
    for n in range(12):
        decision = shell.admit(f"user{n}", replicas={"r1": 64, "r2": 64}, prefix=_key(n))
        assert isinstance(decision, Admitted)
        placed[decision.replica] += 1      # its conversation stays in flight
    assert placed == {"r1": 6, "r2": 6}


def test_a_turn_waits_for_its_cache_as_long_as_computing_it_anew_takes() -> None:
    """Moving a conversation costs what a request served away from its home costs (its
    prompt computed anew): a later turn waits for its home about that long, not longer."""
    shell = _remembering(max_wait_s=60.0)
    key = _key(21)
    first = shell.admit("a", prefix=key)
    assert isinstance(first, Admitted) and not first.at_home
    home = first.replica
    other = "r2" if home == "r1" else "r1"
    for _ in range(20):     # requests served away from any home take 8 s each
        shell.core.release(home, now=1.0, service_s=8.0)
        assert shell.core.try_admit("m", "x", "normal", {home: 2, other: 0}, 1.0, None) \
            == Admitted(home)
    # cached turns served at home take 1 s: the wait for a home follows the 8 s
    for _ in range(20):
        shell.core.release(home, now=1.0, service_s=1.0, at_home=True)
        shell.core.try_admit("m", "x", "normal", {home: 2, other: 0}, 1.0, None)
    while shell.core.in_flight(home) < 2:
        shell.core.try_admit("m", "x", "normal", {home: 2, other: 0}, 1.0, None)
    waiting = shell.admit("a", now=2.0, prefix=key)
    assert isinstance(waiting, Queued) and waiting.ticket.home == home
    assert 7.5 < waiting.ticket.spill_at - 2.0 < 8.5
    # a first turn is placed on the least-loaded replica
    assert shell.admit("b", now=2.0, prefix=_key(22)) == Admitted(other)


def test_a_first_turn_waits_for_its_placed_home_unless_more_wait_than_there_are_slots(
) -> None:
    """A prefix not remembered is cached nowhere. While few requests wait it waits a
    while for the replica it was placed at, leaving the other replica's free slot to
    that replica's cached turns; once more requests wait than there are slots, a slot
    freed anywhere serves it at once (none idles under overload)."""
    shell = _remembering(max_wait_s=60.0)
    one_each = {"r1": 1, "r2": 1}
    shell.fill(one_each)                                   # both replicas busy
    queued = shell.queue("b", now=1.0, prefix=_key(41), replicas=one_each)
    assert not queued.cached
    other = "r2" if queued.home == "r1" else "r1"
    assert shell.core.release(other, now=1.1) == []        # 1 waits, 2 slots: it waits
    assert shell.admit("filler", replicas=one_each, now=1.1) == Admitted(other)
    crowd = shell.queue("c", now=1.2, prefix=_key(42), replicas=one_each)
    assert not crowd.cached                                # now 2 wait for 2 slots
    decided = shell.core.release(other, now=1.3)
    assert [t.id for t in decided] == [queued.id]          # first come, at the other one
    assert decided[0].outcome == Admitted(other)


def test_a_turn_whose_cache_is_at_the_freed_replica_goes_before_a_first_turn() -> None:
    shell = _remembering(max_wait_s=60.0)
    one_each = {"r1": 1, "r2": 1}
    first = shell.admit("a", prefix=_key(31), replicas=one_each)
    assert isinstance(first, Admitted)
    home = first.replica
    shell.core.release(home, now=0.5)
    shell.fill(one_each)                                   # both replicas busy
    newcomer = shell.queue("b", now=1.0, prefix=_key(32), replicas=one_each)
    later = shell.queue("a", now=2.0, prefix=_key(31), replicas=one_each)
    assert later.home == home and later.cached and not newcomer.cached
    shell.core.release(home, now=3.0)
    assert later.outcome == Admitted(home) and newcomer.outcome is None
    other = "r2" if home == "r1" else "r1"
    shell.core.release(other, now=10.0)      # past its wait for a home of its own
    assert newcomer.outcome == Admitted(other)


def test_a_cached_turn_does_not_pass_a_higher_priority_class() -> None:
    shell = _remembering(max_wait_s=60.0)
    one = {"r1": 1}
    assert shell.admit("a", prefix=_key(41), replicas=one) == Admitted("r1")
    shell.core.release("r1", now=0.5)
    shell.fill(one)
    later = shell.queue("a", now=1.0, prefix=_key(41), replicas=one)
    urgent = shell.queue("vip", "high", now=2.0, prefix=_key(42), replicas=one)
    shell.core.release("r1", now=3.0)
    assert urgent.outcome == Admitted("r1") and later.outcome is None
