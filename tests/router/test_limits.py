"""Per-key limits (router/tables/limits.py): the pure decisions table-tested, the shared table
seen by another process, and a router's share of a limit."""

from __future__ import annotations

import math
import multiprocessing
from pathlib import Path

import pytest

from llmgw_runtime.router.tables.limits import (
    SETS,
    WAYS,
    KeyLimit,
    Limiter,
    LimitTable,
    allowance,
    create_file,
    decide,
    estimate_tokens,
    full_at,
    level_at,
    settled,
)

RPM60 = allowance(60, 1)        # one a second, holding 60
TPM600 = allowance(600, 1)      # ten a second, holding 600
KEY = "ab" * 32


def test_a_router_takes_its_share_with_room_for_one_at_least() -> None:
    assert allowance(60, 1) == (1.0, 60.0)
    assert allowance(60, 3) == pytest.approx((20 / 60, 20.0))
    assert allowance(1, 4) == pytest.approx((0.25 / 60, 1.0))
    assert allowance(None, 2) is None


@pytest.mark.parametrize(("level", "at", "now", "expected"), [
    (None, 0.0, 5.0, 60.0),            # never used: full
    (math.nan, 0.0, 5.0, 60.0),        # stored while the kind had no limit: full
    (0.0, 10.0, 10.0, 0.0),
    (0.0, 10.0, 40.0, 30.0),           # refills a second's worth a second
    (0.0, 10.0, 500.0, 60.0),          # never above a minute's worth
    (-30.0, 10.0, 40.0, 0.0),          # a debt is refilled first
    (5.0, 10.0, 9.0, 5.0),             # time never runs backwards
])
def test_a_bucket_refills_continuously_up_to_a_minutes_worth(
        level: float | None, at: float, now: float, expected: float) -> None:
    assert level_at(level, at, now, RPM60) == pytest.approx(expected)


@pytest.mark.parametrize(("rpm", "tpm", "estimate", "allowed", "refused", "wait"), [
    (5.0, 100.0, 40, True, None, 0.0),
    (1.0, 100.0, 40, True, None, 0.0),             # the last request of the minute
    (0.5, 100.0, 40, False, "requests", 0.5),      # half a request: wait half a second
    (5.0, 0.5, 40, False, "tokens", 0.05),         # tokens refill ten a second
    (5.0, -95.0, 40, False, "tokens", 9.6),        # a debt from a settled request
    (0.0, -95.0, 40, False, "tokens", 9.6),        # both: the longer wait, its limit
    (5.0, 1.0, 5000, True, None, 0.0),             # one token left: it may go
])
def test_a_request_goes_when_its_key_has_a_request_and_a_token_left(
        rpm: float, tpm: float, estimate: int, allowed: bool, refused: str | None,
        wait: float) -> None:
    verdict = decide(rpm, tpm, 100.0, 100.0, RPM60, TPM600, estimate)
    assert (verdict.allowed, verdict.refused) == (allowed, refused)
    assert verdict.retry_after_s == pytest.approx(wait)
    if allowed:
        assert (verdict.rpm, verdict.tpm) == (rpm - 1, tpm - estimate)


def test_a_kind_without_a_limit_never_refuses_and_is_stored_as_unknown() -> None:
    verdict = decide(None, None, 0.0, 0.0, None, TPM600, 10)
    assert verdict.allowed and math.isnan(verdict.rpm) and verdict.tpm == 590
    assert decide(0.0, None, 0.0, 0.0, RPM60, None, 10**9).refused == "requests"


def test_settling_replaces_the_estimate_with_what_was_used() -> None:
    assert settled(100.0, 0.0, 0.0, TPM600, charged=300, used=50) == 350
    assert settled(100.0, 0.0, 0.0, TPM600, charged=50, used=300) == -150
    assert settled(590.0, 0.0, 0.0, TPM600, charged=300, used=0) == 600   # never above


def test_an_entry_is_full_again_when_its_slowest_bucket_is() -> None:
    assert full_at(60.0, 600.0, 5.0, RPM60, TPM600) == 5.0
    assert full_at(30.0, 500.0, 5.0, RPM60, TPM600) == 35.0      # rpm: 30 s, tpm: 10 s
    assert full_at(math.nan, -600.0, 5.0, None, TPM600) == 125.0


@pytest.mark.parametrize(("doc", "size", "expected"), [
    ({}, 400, 100),
    ({"max_tokens": 50}, 400, 150),
    ({"max_completion_tokens": 50, "n": 3}, 400, 250),
    ({"max_tokens": 50, "max_completion_tokens": 300}, 400, 400),   # the larger
    ({"max_output_tokens": 7}, 1, 8),
    ({"max_tokens": True}, 4, 1),                 # not a number of tokens
    ({"max_tokens": -5, "n": 10**6}, 4, 1),
    ({"max_tokens": 10**12}, 4, 10_000_001),      # bounded
])
def test_a_requests_tokens_are_estimated_from_its_size_and_its_most_output(
        doc: dict[str, object], size: int, expected: int) -> None:
    assert estimate_tokens(doc, size) == expected


def test_a_limiter_takes_a_request_then_refuses_and_settles_later() -> None:
    now = [1000.0]
    limiter = Limiter(LimitTable(), (1, 1), clock=lambda: now[0])
    limit = KeyLimit("app", rpm=2, tpm=100)
    assert limiter.check(KEY, limit, 90).allowed
    assert limiter.check(KEY, limit, 5).allowed         # 10 tokens left: allowed
    refused = limiter.check(KEY, limit, 5)
    assert (refused.allowed, refused.refused) == (False, "requests")
    assert refused.retry_after_s == pytest.approx(30.0)
    limiter.settle(KEY, limit, charged=90, used=20)    # 70 back: 75 left
    now[0] += 6.0                                        # 10 tokens back, no request yet
    assert limiter.check(KEY, limit, 1).refused == "requests"
    now[0] += 24.0                                       # a request back, and 40 tokens
    verdict = limiter.check(KEY, limit, 1)
    assert verdict.allowed and verdict.tpm == pytest.approx(100 - 1)   # full, then 1
    limiter.settle(KEY, limit, charged=1, used=60)
    now[0] += 30.0
    assert limiter.check(KEY, limit, 0).tpm == pytest.approx(100 - 1 - 59 + 50)


def test_two_routers_each_let_through_half(tmp_path: Path) -> None:
    limit = KeyLimit("app", rpm=10)
    passed = []
    for index in (1, 2):
        limiter = Limiter(LimitTable(), (index, 2), clock=lambda: 0.0)
        passed.append(sum(limiter.check(KEY, limit, 0).allowed for _ in range(20)))
    assert passed == [5, 5]


def _take(path: str, n: int, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    limiter = Limiter(LimitTable(path), (1, 1), clock=lambda: 0.0)
    out.put(sum(limiter.check(KEY, KeyLimit("app", rpm=5), 0).allowed for _ in range(n)))


def test_the_table_file_is_one_bucket_for_every_process_of_a_router(tmp_path: Path) -> None:
    path = create_file(str(tmp_path))
    out: multiprocessing.Queue = multiprocessing.get_context("fork").Queue()  # type: ignore[type-arg]
    for _ in range(2):
        proc = multiprocessing.get_context("fork").Process(target=_take, args=(path, 4, out))
        proc.start()
        proc.join(10)
    assert sorted([out.get(timeout=5), out.get(timeout=5)]) == [1, 4]


def test_a_full_set_forgets_the_entry_full_again_first() -> None:
    table = LimitTable()
    # keys of one set: the same index bits, different tags
    keys = [f"{n + 1:016x}" + "00000000" + "0" * 40 for n in range(WAYS + 1)]
    for n, key in enumerate(keys[:WAYS]):
        table.write(key, 0.0, full=100.0 + n, rpm=float(n), tpm=0.0)
    table.write(keys[WAYS], 0.0, full=50.0, rpm=42.0, tpm=0.0)   # evicts full=100 (key 0)
    assert table.read(keys[0]) is None
    assert [table.read(k) for k in keys[1:WAYS]] == [(0.0, float(n), 0.0)
                                                     for n in range(1, WAYS)]
    assert table.read(keys[WAYS]) == (0.0, 42.0, 0.0)
    assert SETS * WAYS >= 32_768
