"""control/resolve.py: a node's host name is looked up at most once a minute per process,
an address or nothing is never looked up, and the cache stays bounded."""

from __future__ import annotations

from llmgw_runtime.control.resolve import Resolver


class Lookups:
    """A fake resolver: every name resolves to 10.0.0.<times asked>."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, name: str) -> tuple[str, ...]:
        self.asked.append(name)
        return (f"10.0.0.{len(self.asked)}",)


def test_a_name_is_looked_up_again_only_after_the_ttl() -> None:
    now = [100.0]
    lookup = Lookups()
    resolve = Resolver(lookup, clock=lambda: now[0], ttl_s=60)
    assert resolve("gpu1") == ("10.0.0.1",)
    now[0] += 60
    assert resolve("gpu1") == ("10.0.0.1",)                # cached
    now[0] += 1
    assert resolve("gpu1") == ("10.0.0.2",)                # looked up again
    assert lookup.asked == ["gpu1", "gpu1"]


def test_an_address_or_nothing_is_never_looked_up() -> None:
    lookup = Lookups()
    resolve = Resolver(lookup)
    assert resolve("") == resolve("10.1.2.3") == resolve("fd00::1") == ()
    assert lookup.asked == []


def test_the_cache_starts_afresh_at_its_limit() -> None:
    resolve = Resolver(Lookups(), limit=2)
    for name in ("a", "b", "c"):
        resolve(name)
    assert list(resolve.cache) == ["c"]
