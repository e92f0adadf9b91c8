"""The garbage collector keeper (llmgw_runtime/gckeeper.py): what lives is frozen out of
the full collections' walk, and a cycle dropped after it was frozen is still freed, at the
next full collection of everything."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from llmgw_runtime.gckeeper import Keeper


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()           # this test process goes on collecting as before


def test_what_lives_leaves_the_full_collections_walk() -> None:
    keeper = Keeper(unfreeze_every_s=900.0)
    kept = [[i] for i in range(5000)]           # a cache's entries
    keeper.tick(0.0)
    assert gc.get_freeze_count() >= len(kept)
    tracked = len(gc.get_objects())
    assert all(not any(x is k for x in gc.get_objects(2)) for k in kept[:3])
    assert tracked < gc.get_freeze_count()      # the walk sees what is new only


def test_young_garbage_is_collected_before_the_freeze() -> None:
    dropped = Cycle()
    gone = weakref.ref(dropped)
    del dropped
    Keeper().tick(0.0)
    assert gone() is None


def test_a_cycle_dropped_after_the_freeze_is_freed_at_the_full_collection() -> None:
    keeper = Keeper(unfreeze_every_s=900.0)
    cycle = Cycle()
    ref = weakref.ref(cycle)
    keeper.tick(0.0)                            # frozen while alive
    del cycle
    gc.collect()
    assert ref() is not None                    # not in the walk: not freed yet
    keeper.tick(899.0)
    assert ref() is not None
    keeper.tick(900.0)                          # everything collected once
    assert ref() is None
    assert gc.get_freeze_count() > 0            # and frozen again
