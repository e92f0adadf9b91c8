"""Slowing down guesses: the pure throttle, table-tested with ``now`` passed in, then where
it is used: the control API's bearer-token check and the console login (both backends)."""

from __future__ import annotations

import pytest

from llmgw_runtime.throttle import Policy, Throttle, retry_after

from .conftest import ADMIN, JOIN, ROUTER, Api

P = Policy(free=3, first_delay_s=2.0, max_delay_s=10.0, window_s=100.0, max_addresses=4)
A, B = "10.0.0.1", "10.0.0.2"


def run(steps: list[tuple[str, str, float]]) -> list[float]:
    """Play (what, address, now) steps: "fail" -> the refusal earned, "wait" -> the wait
    asked of the address, "ok" -> a success (0)."""
    throttle = Throttle(P)
    out = []
    for what, address, now in steps:
        if what == "fail":
            out.append(throttle.failed(address, now))
        elif what == "wait":
            out.append(throttle.wait_s(address, now))
        else:
            throttle.succeeded(address)
            out.append(0.0)
    return out


@pytest.mark.parametrize(("name", "steps", "expected"), [
    ("free failures earn no wait",
     [("fail", A, 0), ("fail", A, 1), ("fail", A, 2), ("wait", A, 2)],
     [0, 0, 0, 0]),
    ("the failure after the free ones refuses, and each further one doubles",
     [("fail", A, 0), ("fail", A, 0), ("fail", A, 0), ("fail", A, 0), ("wait", A, 1),
      ("fail", A, 2), ("wait", A, 2), ("fail", A, 6), ("fail", A, 14), ("fail", A, 24)],
     [0, 0, 0, 2, 1, 4, 4, 8, 10, 10]),
    ("the wait runs out",
     [("fail", A, 0)] * 4 + [("wait", A, 1.5), ("wait", A, 2), ("wait", A, 3)],
     [0, 0, 0, 2, 0.5, 0, 0]),
    ("addresses are counted apart",
     [("fail", A, 0)] * 4 + [("wait", B, 0), ("fail", B, 0), ("wait", A, 0)],
     [0, 0, 0, 2, 0, 0, 2]),
    ("a success forgets the failures",
     [("fail", A, 0)] * 4 + [("ok", A, 3), ("wait", A, 3), ("fail", A, 3), ("fail", A, 3),
                             ("fail", A, 3)],
     [0, 0, 0, 2, 0, 0, 0, 0, 0]),
    ("a quiet window after the refusal ended forgets them",
     [("fail", A, 0)] * 4 + [("fail", A, 102), ("fail", A, 103)],
     [0, 0, 0, 2, 0, 0]),
    ("less than a window of quiet does not",
     [("fail", A, 0)] * 4 + [("fail", A, 50)],
     [0, 0, 0, 2, 4]),
])
def test_throttle_table(name: str, steps: list[tuple[str, str, float]],
                        expected: list[float]) -> None:
    assert run(steps) == pytest.approx(expected), name


def test_memory_is_bounded_least_recently_failed_first() -> None:
    throttle = Throttle(P)
    for i in range(4):
        for _ in range(4):
            throttle.failed(f"10.0.1.{i}", 0)
    throttle.failed("10.0.1.0", 0)                  # .0 is the most recent now
    throttle.failed("10.0.2.0", 0)                  # a fifth address: .1 is dropped
    assert len(throttle) == 4
    assert throttle.wait_s("10.0.1.1", 0) == 0
    assert throttle.wait_s("10.0.1.0", 0) > 0 and throttle.wait_s("10.0.1.2", 0) > 0
    big = Throttle()
    for i in range(12_000):
        big.failed(f"a{i}", 0)
    assert len(big) == 10_000


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert [retry_after(s) for s in (0.01, 1.0, 1.2, 299.5)] == ["1", "1", "2", "300"]


def test_wrong_bearer_tokens_are_refused_429_for_a_while_even_the_right_one(
        api: Api) -> None:
    for _ in range(10):
        assert api.call("GET", "/api/v1/models", "llmgw-admin-guess").status_code == 401
    assert api.call("GET", "/api/v1/models", "llmgw-admin-guess").status_code == 401
    refused = api.call("GET", "/api/v1/models")          # the right token, too late
    assert refused.status_code == 429
    assert refused.json["error"]["reason"] == "too_many_failures"
    assert "try again in" in refused.json["error"]["message"]
    assert int(refused.headers["Retry-After"]) >= 1
    other = api.call("GET", "/api/v1/models", environ_base={"REMOTE_ADDR": "10.9.9.9"})
    assert other.status_code == 200                      # another address is not held up


def test_a_right_token_resets_the_count_and_missing_tokens_are_not_guesses(
        api: Api) -> None:
    for _ in range(9):
        assert api.call("GET", "/api/v1/models", "llmgw-admin-guess").status_code == 401
    assert api.call("GET", "/api/v1/models").status_code == 200
    for _ in range(9):
        assert api.call("GET", "/api/v1/models", "llmgw-admin-guess").status_code == 401
    for _ in range(20):
        assert api.call("GET", "/api/v1/models", None).status_code == 401
    assert api.call("GET", "/api/v1/models").status_code == 200


def test_console_login_is_throttled_with_retry_after(api: Api) -> None:
    for _ in range(11):
        resp = api.client.post("/console/login", data={"token": "llmgw-admin-guess"})
        assert resp.status_code == 401
    refused = api.client.post("/console/login", data={"token": ADMIN})
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert "too many failed logins" in refused.get_data(as_text=True)
    assert "Set-Cookie" not in refused.headers
    # the same address's API calls wait too: both guess admin tokens
    assert api.call("GET", "/api/v1/models").status_code == 429


def test_wrong_admin_tokens_do_not_lock_out_routers_and_agents_of_that_address(
        api: Api) -> None:
    """Issue 28: failures are counted per address and kind of token. Many wrong admin
    tokens from 127.0.0.1 hold up admin tokens from there (the right one too: else a
    right guess would be told at full speed), not the router's token, the join token or a
    node's credential on the same address."""
    cred = api.join("n1")
    for _ in range(15):
        assert api.call("GET", "/api/v1/models", "llmgw-admin-guess").status_code in (401, 429)
    assert api.call("GET", "/api/v1/models").status_code == 429
    assert api.call("GET", "/api/v1/routes", ROUTER).status_code == 200
    assert api.report(cred).status_code == 200
    assert api.call("POST", "/api/v1/agent/join", JOIN, json={"node": "n2"}).status_code == 200
    # a router token's guesses are their own count: the router's right token then waits
    for _ in range(12):
        api.call("GET", "/api/v1/routes", "llmgw-router-guess")
    assert api.call("GET", "/api/v1/routes", ROUTER).status_code == 429
    assert api.report(cred).status_code == 200
