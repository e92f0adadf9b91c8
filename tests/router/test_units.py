"""Pure parts of the router: config validation, the balancer's down marks and last use,
routes table parsing."""

from __future__ import annotations

import pytest

from llmgw_runtime.api.router import Endpoint, RouteModel, Routes
from llmgw_runtime.errors import ConfigError
from llmgw_runtime.router.app import model_entry
from llmgw_runtime.router.balancer import Balancer
from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.router.routes import parse_table
from llmgw_runtime.router.serve import gunicorn_options
from llmgw_runtime.settings import load

from .conftest import ROUTER_TOKEN

E1, E2 = (Endpoint(replica_id=f"r{i}", url=f"http://127.0.0.1:{9000 + i}") for i in (1, 2))


def test_config_requires_control_url_and_token_and_reports_both() -> None:
    with pytest.raises(ConfigError) as info:
        load(RouterConfig, env={})
    text = str(info.value)
    assert "control_url is required" in text and "router_token is required" in text


def test_config_reads_llmgw_env_and_flags_win() -> None:
    env = {"LLMGW_CONTROL_URL": "http://127.0.0.1:8470", "LLMGW_ROUTER_TOKEN": ROUTER_TOKEN,
           "LLMGW_WORKERS": "4", "LLMGW_REQUIRE_API_KEY": "false"}
    cfg = load(RouterConfig, env=env, port=9999)
    assert (cfg.workers, cfg.require_api_key, cfg.port) == (4, False, 9999)
    assert cfg.worker_connections == 2000


def test_config_refuses_bad_values_all_at_once() -> None:
    cfg = RouterConfig(control_url="ftp://x", router_token=ROUTER_TOKEN, workers=0,
                       refresh_interval_s=0)
    problems = cfg.validate()
    assert len(problems) == 3


def test_gunicorn_options_use_gevent_and_no_control_socket() -> None:
    opts = gunicorn_options(RouterConfig(control_url="http://c", router_token="t", port=1234))
    assert opts["worker_class"] == "llmgw_runtime.router.http.server.RouterWorker" and opts["control_socket_disable"] is True
    assert opts["bind"] == ["127.0.0.1:1234"] and opts["worker_connections"] == 2000


def test_balancer_records_the_last_use_of_each_replica_it_is_told_of() -> None:
    now = [10.0]
    b = Balancer(clock=lambda: now[0])
    assert b.last_used() == {}
    b.touch("r1")
    now[0] += 5
    b.touch("r2")
    b.touch("r2")
    assert b.last_used() == {"r1": 10.0, "r2": 15.0}


def test_balancer_forgets_the_last_use_of_replicas_the_table_dropped() -> None:
    b = Balancer()
    b.touch("r1")
    b.touch("r2")
    b.forget_except({"r2"})
    assert set(b.last_used()) == {"r2"}


def test_parse_table_keeps_first_seen_and_rejects_bad_shape() -> None:
    doc = {"models": [{"name": "m", "state": "ready", "reason": None, "on_demand": False,
                       "endpoints": [{"replica_id": "r1", "url": "http://h:1/"}]}],
           "api_key_hashes": ["ab" * 32]}
    t1 = parse_table(doc, 100.0)
    t2 = parse_table(doc, 200.0, t1)
    assert t2.first_seen == {"m": 100}
    assert t2.models["m"].endpoints == (Endpoint(replica_id="r1", url="http://h:1"),)
    assert t2.api_key_hashes == frozenset({"ab" * 32})
    with pytest.raises(ValueError):
        parse_table({"nope": 1}, 0.0)


def test_created_in_v1_models_is_the_same_on_every_router() -> None:
    # Two routers that first saw the model at different times answer when it was applied.
    doc = {"models": [{"name": "m", "state": "ready", "aliases": ["m-latest"],
                       "created": 1_700_000_000}], "api_key_hashes": []}
    one, other = parse_table(doc, 1_800_000_000.0), parse_table(doc, 1_800_000_555.0)
    assert model_entry(one, "m") == model_entry(other, "m") == {
        "id": "m", "object": "model", "created": 1_700_000_000, "owned_by": "llmgw"}
    assert model_entry(other, "m-latest")["created"] == 1_700_000_000
    older = parse_table({"models": [{"name": "m", "state": "ready"}]}, 1_800_000_000.0)
    assert model_entry(older, "m")["created"] == 1_800_000_000   # an older control service


def _table_with(model: dict[str, object] | None = None, endpoint: dict[str, object] | None = None,
                **top: object) -> dict[str, object]:
    ep = {"replica_id": "r1", "url": "http://h:1/", "slots": 2, **(endpoint or {})}
    m = {"name": "m", "state": "ready", "endpoints": [ep], **(model or {})}
    return {"models": [m], "api_key_hashes": ["ab" * 32], **top}


def test_parse_table_carries_slots_routing_queue_and_key_priorities() -> None:
    table = parse_table(_table_with({"routing": "least-outstanding", "max_queue": 0,
                                     "max_wait_s": 2.5},
                                    key_priorities={"ab" * 32: "high"}), 0.0)
    route = table.models["m"]
    assert route.endpoints == (Endpoint(replica_id="r1", url="http://h:1", slots=2),)
    assert (route.routing, route.max_queue, route.max_wait_s) == ("least-outstanding", 0, 2.5)
    assert table.key_priorities == {"ab" * 32: "high"}
    plain = parse_table(_table_with(endpoint={"slots": None}), 0.0).models["m"]
    assert plain.endpoints[0].slots is None and plain.routing == "prefix-affinity"


def test_the_table_keeps_the_messages_of_control_and_only_drops_a_final_slash() -> None:
    plain = Routes.model_validate(_table_with(endpoint={"url": "http://h:1"},
                                              model={"max_tokens": {"max": 64}}))
    route = parse_table(plain, 0.0).models["m"]
    assert route is plain.models[0]                      # no copy: the message itself
    assert route.max_tokens is not None and route.max_tokens.max == 64
    slashed = Routes.model_validate(_table_with())       # http://h:1/
    route = parse_table(slashed, 0.0).models["m"]
    assert isinstance(route, RouteModel) and route.endpoints[0].url == "http://h:1"
    assert route.model_copy(update={"endpoints": slashed.models[0].endpoints}) \
        == slashed.models[0]                             # nothing else differs


@pytest.mark.parametrize("doc", [
    _table_with(endpoint={"slots": 0}),
    _table_with(endpoint={"slots": 5000}),                 # huge
    _table_with(endpoint={"slots": "2"}),                  # wrong type
    _table_with(endpoint={"slots": 2.5}),
    _table_with(endpoint={"slots": True}),
    _table_with(endpoint={"slots": [2]}),                  # nested
    _table_with({"routing": "sticky"}),
    _table_with({"routing": "prefix-affinity\x1b[31m"}),   # an escape sequence
    _table_with({"max_queue": -1}),
    _table_with({"max_queue": 10**9}),
    _table_with({"max_wait_s": 0}),
    _table_with({"max_wait_s": 1e300}),
    _table_with({"max_wait_s": float("nan")}),             # non-finite
    _table_with({"max_wait_s": float("inf")}),
    _table_with(key_priorities={"ab" * 32: "urgent"}),
    _table_with(key_priorities={"not-a-hash": "high"}),
    _table_with(key_priorities=["ab" * 32]),
    # issue 17: key scopes and expiries, aliases, fallbacks
    _table_with(key_models={"ab" * 32: "m"}),              # wrong type
    _table_with(key_models={"ab" * 32: [["m"]]}),          # nested
    _table_with(key_models={"ab" * 32: ["m\x1b[31m"]}),    # an escape sequence
    _table_with(key_models={"ab" * 32: ["m"] * 5000}),     # huge
    _table_with(key_models={"not-a-hash": ["m"]}),
    _table_with(key_expires_in_s={"ab" * 32: float("nan")}),
    _table_with(key_expires_in_s={"ab" * 32: float("inf")}),
    _table_with(key_expires_in_s={"ab" * 32: 1e300}),
    _table_with(key_expires_in_s={"ab" * 32: "soon"}),
    _table_with({"aliases": "chat"}),
    _table_with({"aliases": ["has space"]}),
    _table_with({"aliases": [f"a{i}" for i in range(17)]}),
    _table_with({"fallback": [{"name": "b"}]}),
    _table_with({"fallback": ["b\x00"]}),
    _table_with({"fallback": [f"b{i}" for i in range(9)]}),
])
def test_a_routes_table_with_a_hostile_admission_field_is_refused_whole(doc: object) -> None:
    """The router keeps its last good table (RoutesCache) rather than route by a table
    whose slots, routing, queue bounds, key priorities, scopes or expiries, aliases or
    fallbacks are out of range."""
    with pytest.raises(ValueError, match="malformed"):
        parse_table(doc, 0.0)


def test_balancer_skips_a_replica_marked_down_until_the_table_drops_it_or_it_cools() -> None:
    now = [1000.0]
    b = Balancer(clock=lambda: now[0])
    assert b.mark_down("r1", "refused", cool_down_s=30) is True
    assert b.mark_down("r1", "refused again", cool_down_s=30) is False    # reported once
    assert b.usable([E1, E2]) == (E2,) and b.down("r1") == "refused again"
    b.forget_except({"r1", "r2"})                      # still listed: still down
    assert b.usable([E1, E2]) == (E2,)
    b.forget_except({"r2"})                            # control took it out
    assert b.down("r1") is None and b.usable([E1, E2]) == (E1, E2)
    b.mark_down("r2", "refused", cool_down_s=30)
    now[0] += 30                                       # cool-down passed
    assert b.usable([E2]) == (E2,)


def test_parse_table_carries_the_start_streak_and_defaults_to_none() -> None:
    doc = {"models": [
        {"name": "m", "state": "starting", "failures": 2, "last_error": "bad magic",
         "retry_after_s": 9.5},
        {"name": "n", "state": "ready"}]}
    t = parse_table(doc, 1.0)
    assert (t.models["m"].failures, t.models["m"].last_error,
            t.models["m"].retry_after_s) == (2, "bad magic", 9.5)
    assert (t.models["n"].failures, t.models["n"].last_error) == (0, None)
    with pytest.raises(ValueError, match="failures"):
        parse_table({"models": [{"name": "m", "state": "ready", "failures": -1}]}, 1.0)


class _Client:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def get_routes(self) -> dict[str, object]:
        self.calls.append("routes")
        return {"models": []}

    def post_unreachable(self, replica_id: str, reason: str) -> None:
        self.calls.append(f"unreachable {replica_id}: {reason}")

    def post_idle(self, replicas: dict[str, float]) -> None:
        self.calls.append("idle")


def test_tick_posts_unreachable_replicas_before_fetching_the_table() -> None:
    from llmgw_runtime.router.routes import RoutesCache

    client = _Client()
    cache = RoutesCache(client, 1.0, lambda: {"r1": 5.0})  # type: ignore[arg-type]
    cache.report_unreachable("r1", "refused")
    cache.report_unreachable("r1", "refused")
    assert client.calls == []                          # never on the request's time
    cache.tick()
    assert client.calls == ["unreachable r1: refused", "routes", "idle"]
    cache.tick()
    assert client.calls[3:] == ["routes", "idle"]


def test_refresh_since_shares_one_fetch_begun_after_the_caller_asked() -> None:
    from llmgw_runtime.router.routes import RoutesCache

    now = [100.0]
    client = _Client()
    cache = RoutesCache(client, 1.0, dict, clock=lambda: now[0])  # type: ignore[arg-type]
    cache.refresh()
    assert client.calls == ["routes"]
    assert cache.refresh_since(100.0) is not None and client.calls == ["routes"]  # shared
    now[0] = 100.5
    cache.refresh_since(100.4)
    assert client.calls == ["routes", "routes"]
