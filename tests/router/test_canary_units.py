"""Canary and drain bookkeeping without sockets: the version pick, the per-version counts
and their posting each routes tick (with the in-flight counts a draining replica waits
for)."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw_runtime.api.router import Endpoint, ModelVersions, RouteModel
from llmgw_runtime.router.canary import CANARY, STABLE, VersionBook, pick
from llmgw_runtime.router.metrics import RouterMetrics
from llmgw_runtime.router.proxy import Answered
from llmgw_runtime.router.routes import ControlError, RoutesCache
from llmgw_runtime.router.tokens import Tokens


def route(percent: int, *eps: tuple[str, bool]) -> RouteModel:
    return RouteModel(name="m", state="ready", canary_percent=percent,
                      endpoints=tuple(Endpoint(replica_id=rid, url=f"http://{rid}:1",
                                               canary=canary) for rid, canary in eps))


def everything(eps: Any) -> tuple[Endpoint, ...]:
    return tuple(eps)


def test_no_canary_without_a_share_or_without_both_versions() -> None:
    assert pick(route(0, ("a", False), ("b", True)), None, everything) is None
    assert pick(route(10, ("a", False), ("b", False)), None, everything) is None
    assert pick(route(10, ("b", True)), None, everything) is None


def test_a_prefix_always_picks_the_same_version_and_the_share_holds() -> None:
    r = route(30, ("a", False), ("b", True))
    picks = [pick(r, i.to_bytes(16, "big"), everything) for i in range(1000)]
    assert all(p is not None for p in picks)
    share = sum(p[0] == CANARY for p in picks if p is not None)
    assert share == 300               # the key's last bytes modulo 100, below 30
    again = pick(r, (7).to_bytes(16, "big"), everything)
    assert again == picks[7]


def test_a_version_with_nothing_usable_gives_way_to_the_other() -> None:
    r = route(50, ("a", False), ("b", True))
    only_a = lambda eps: tuple(e for e in eps if e.replica_id == "a")  # noqa: E731
    for i in range(100):
        chosen = pick(r, i.to_bytes(16, "big"), only_a)
        assert chosen is not None and chosen[0] == STABLE
        assert [e.replica_id for e in chosen[1]] == ["a"]


def test_versions_count_errors_first_bytes_and_tokens_and_survive_a_failed_post() -> None:
    book = VersionBook(RouterMetrics())
    ok = book.tap("m", STABLE, 0.0)
    ok.tokens(Tokens(5, 3))
    ok.watch(Answered(200, [], [b"{}"]))
    book.tap("m", CANARY, 0.0).watch(Answered(503, [], [b"{}"]))
    book.tap("m", CANARY, 0.0).failed()
    taken = book.take()
    assert set(taken) == {"m"}
    m = taken["m"]
    assert (m.stable.requests, m.stable.errors, m.stable.tokens, m.stable.answered) \
        == (1, 0, 8, 1)
    assert (m.canary.requests, m.canary.errors, m.canary.answered) == (2, 2, 1)
    assert book.take() == {}
    book.put_back(taken)
    assert book.take() == taken


class _Control:
    def __init__(self, draining: list[str], fail: bool = False) -> None:
        self.draining = draining
        self.fail = fail
        self.posts: list[dict[str, Any]] = []

    def get_routes(self) -> dict[str, object]:
        return {"models": [{"name": "m", "state": "starting", "draining": self.draining}]}

    def post_idle(self, replicas: dict[str, float], capacity: Any = None,
                  **extra: Any) -> None:
        if self.fail:
            raise ControlError("down")
        self.posts.append({"replicas": replicas, **extra})


def test_the_idle_map_goes_every_tick_while_a_replica_drains_or_requests_are_in_flight(
        ) -> None:
    in_flight: dict[str, int] = {"r-old": 2}
    book = VersionBook(RouterMetrics())
    control = _Control(["r-old"])
    cache = RoutesCache(control, 1.0, dict, in_flight=lambda: dict(in_flight),  # type: ignore[arg-type]
                        versions=book)
    cache.tick()
    in_flight.clear()
    cache.tick()
    assert control.posts == [{"replicas": {}, "in_flight": {"r-old": 2}},
                             {"replicas": {}, "in_flight": {}}]
    control.draining = []
    cache.tick()                      # nothing drains, nothing in flight: nothing to say
    assert len(control.posts) == 2
    book.tap("m", CANARY, 0.0).failed()
    control.fail = True
    cache.tick()                      # not delivered: kept for the next post
    control.fail = False
    cache.tick()
    assert control.posts[-1]["versions"]["m"] == ModelVersions.model_validate(
        {"canary": {"requests": 1, "errors": 1}})


@pytest.mark.parametrize("percent", [1, 10, 50])
def test_random_picks_hold_the_share(percent: int) -> None:
    r = route(percent, ("a", False), ("b", True))
    picks = [pick(r, None, everything) for _ in range(20_000)]
    share = sum(p is not None and p[0] == CANARY for p in picks) / len(picks)
    assert abs(share - percent / 100) < 0.02
