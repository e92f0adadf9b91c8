"""Pure parts of the router: config validation, balancer, routes table parsing."""

from __future__ import annotations

import pytest

from llmgw_runtime.errors import ConfigError
from llmgw_runtime.router.balancer import Balancer, Endpoint
from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.router.routes import parse_table
from llmgw_runtime.router.serve import gunicorn_options
from llmgw_runtime.settings import load

E1, E2, E3 = (Endpoint(f"r{i}", f"http://127.0.0.1:{9000 + i}") for i in (1, 2, 3))


def test_config_requires_control_url_and_token_and_reports_both() -> None:
    with pytest.raises(ConfigError) as info:
        load(RouterConfig, env={})
    text = str(info.value)
    assert "control_url is required" in text and "router_token is required" in text


def test_config_reads_llmgw_env_and_flags_win() -> None:
    env = {"LLMGW_CONTROL_URL": "http://127.0.0.1:8470", "LLMGW_ROUTER_TOKEN": "t",
           "LLMGW_WORKERS": "4", "LLMGW_REQUIRE_API_KEY": "false"}
    cfg = load(RouterConfig, env=env, port=9999)
    assert (cfg.workers, cfg.require_api_key, cfg.port) == (4, False, 9999)
    assert cfg.worker_connections == 2000


def test_config_refuses_bad_values_all_at_once() -> None:
    cfg = RouterConfig(control_url="ftp://x", router_token="t", workers=0,
                       refresh_interval_s=0)
    problems = cfg.validate()
    assert len(problems) == 3


def test_gunicorn_options_use_gevent_and_no_control_socket() -> None:
    opts = gunicorn_options(RouterConfig(control_url="http://c", router_token="t", port=1234))
    assert opts["worker_class"] == "gevent" and opts["control_socket_disable"] is True
    assert opts["bind"] == ["127.0.0.1:1234"] and opts["worker_connections"] == 2000


def test_balancer_picks_least_outstanding() -> None:
    b = Balancer(clock=lambda: 100.0)
    first = b.acquire([E1, E2])
    second = b.acquire([E1, E2])
    assert {first, second} == {E1, E2}
    assert first is not None
    b.release(first.replica_id)
    assert b.acquire([E1, E2]) == first  # the other still has one outstanding


def test_balancer_spreads_ties_and_records_last_use() -> None:
    now = [10.0]
    b = Balancer(clock=lambda: now[0])
    seen = set()
    for _ in range(6):
        ep = b.acquire([E1, E2, E3])
        assert ep is not None
        seen.add(ep.replica_id)
        b.release(ep.replica_id)
        now[0] += 1
    assert seen == {"r1", "r2", "r3"}
    assert set(b.last_used()) == {"r1", "r2", "r3"}
    assert max(b.last_used().values()) == 15.0


def test_balancer_avoids_failed_replica_unless_it_is_the_only_one() -> None:
    b = Balancer()
    assert b.acquire([E1, E2], avoid={"r1"}) == E2
    assert b.acquire([E1], avoid={"r1"}) == E1
    assert b.acquire([]) is None


def test_balancer_release_never_goes_negative_and_forget_prunes() -> None:
    b = Balancer()
    b.release("r9")
    assert b.outstanding("r9") == 0
    b.acquire([E1])
    b.forget_except({"r2"})
    assert b.last_used() == {}


def test_parse_table_keeps_first_seen_and_rejects_bad_shape() -> None:
    doc = {"models": [{"name": "m", "state": "ready", "reason": None, "on_demand": False,
                       "endpoints": [{"replica_id": "r1", "url": "http://h:1/"}]}],
           "api_key_hashes": ["ab" * 32]}
    t1 = parse_table(doc, 100.0)
    t2 = parse_table(doc, 200.0, t1)
    assert t2.first_seen == {"m": 100}
    assert t2.models["m"].endpoints == (Endpoint("r1", "http://h:1"),)
    assert t2.api_key_hashes == frozenset({"ab" * 32})
    with pytest.raises(ValueError):
        parse_table({"nope": 1}, 0.0)
