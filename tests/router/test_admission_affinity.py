"""Prefix affinity in the admission core (router/admission/core.py): a request is admitted at
its home replica, waits there for a while when it is full, then spills over."""

from __future__ import annotations

from llmgw_runtime.router.admission.affinity import choose, prefix_key
from llmgw_runtime.router.admission.core import Admitted, Queued

from .test_admission import TWO, Shell

# -- prefix affinity ------------------------------------------------------------------

def test_a_prefix_goes_to_its_home_replica_while_it_has_room() -> None:
    shell = Shell()
    key = prefix_key({"messages": [{"role": "user", "content": "hello"}]})
    assert key is not None
    home = choose(key, list(TWO), {})
    assert shell.admit(prefix=key) == Admitted(home)
    assert shell.admit(prefix=key) == Admitted(home)
    # Home full: the next ones wait for it (one round: up to its 2 slots) ...
    waiting = [shell.admit(prefix=key) for _ in range(2)]
    assert all(isinstance(w, Queued) and w.ticket.home == home for w in waiting)
    other = "r2" if home == "r1" else "r1"
    # ... then its load (4) is both twice its slots and over ceil(1.25 * 5 / 2) = 4.
    assert shell.admit(prefix=key) == Admitted(other)


def test_a_waiting_ticket_with_a_prefix_takes_its_home_when_several_are_free() -> None:
    shell = Shell()
    key = b"conversation"
    home = choose(key, ["r1", "r2", "r3"], {})
    three = {"r1": 1, "r2": 1, "r3": 1}
    shell.fill(three)
    ticket = shell.queue(replicas=three)
    shell.core.update("m", {"r1": 2, "r2": 2, "r3": 2}, now=1.0)
    assert ticket.outcome == Admitted(home)


def _busy_home(shell: Shell) -> tuple[bytes, str, str]:
    """Two replicas of two slots: a conversation's prefix fills its home replica, one
    other request runs at the other. Returns (prefix, home, other)."""
    key = b"a long system prompt and the first question"
    home = choose(key, ["r1", "r2"], {})
    other = "r2" if home == "r1" else "r1"
    for _ in range(2):
        assert shell.admit("a", prefix=key) == Admitted(home)
    assert shell.admit("b") == Admitted(other)
    return key, home, other


def test_a_conversation_waits_for_its_home_replica_rather_than_lose_its_cache() -> None:
    shell = Shell(max_wait_s=30.0)
    key, home, other = _busy_home(shell)
    waiting = shell.admit("a", now=1.0, prefix=key)   # the other replica has a free slot
    assert isinstance(waiting, Queued) and waiting.ticket.home == home
    # A request with no prefix of its own takes the free slot meanwhile: no one waits for it.
    assert shell.admit("c", now=1.5) == Admitted(other)
    shell.core.release(home, now=2.0)
    assert waiting.ticket.outcome == Admitted(home)


def test_a_conversation_whose_home_stays_busy_spills_to_a_free_replica() -> None:
    shell = Shell(max_wait_s=30.0)
    key, home, other = _busy_home(shell)
    ticket = shell.queue("a", now=1.0, prefix=key)
    assert ticket.spill_at > 1.0
    shell.core.expire(now=ticket.spill_at - 0.01)
    assert ticket.outcome is None
    shell.core.expire(now=ticket.spill_at)
    assert ticket.outcome == Admitted(other)


def test_a_hot_prefix_spreads_once_its_home_is_well_above_the_mean() -> None:
    shell = Shell()
    key = b"everyone's system prompt"
    home = choose(key, ["r1", "r2", "r3"], {})
    three = {"r1": 1, "r2": 1, "r3": 1}
    assert shell.admit(prefix=key, replicas=three) == Admitted(home)
    assert isinstance(shell.admit(prefix=key, replicas=three), Queued)   # load 2: its floor
    spilled = shell.admit(prefix=key, replicas=three)    # 3 > 2 x slots and > ceil(1.25 x 4/3)
    assert isinstance(spilled, Admitted) and spilled.replica != home
