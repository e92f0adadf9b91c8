"""Remembered homes of prefixes (router/homes.py) and how admission uses them: a new
conversation goes to the least-loaded replica, its later turns follow it there from any
worker, and a conversation moved by load is remembered where it moved."""

from __future__ import annotations

import hashlib
from pathlib import Path

from llmgw_runtime.router import homes
from llmgw_runtime.router.admission import Admitted, Queued
from llmgw_runtime.router.affinity import choose
from llmgw_runtime.router.homes import Homes

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
