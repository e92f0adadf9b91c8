"""The usage tables (store/usage.py), on SQLite and PostgreSQL: hourly rows and totals add
up (requests, tokens and refusals), a reporter's report is claimed once, old rows and silent reporters are forgotten while
the totals stay."""

from __future__ import annotations

import sqlalchemy as sa

from llmgw_runtime.store import Store, usage
from llmgw_runtime.store.usage import HOUR_S, REPORTER_TTL_S, RETENTION_S, Used

NOW = 1_800_000_000.0


def test_rows_of_one_hour_add_up_and_the_totals_span_every_hour(store: Store) -> None:
    with store.begin() as conn:
        usage.add_usage(conn, usage.bucket_of(NOW), [Used("a", "m", 1, 10, 2, 3),
                                                     Used("a", "m", 2, 20, 4),
                                                     Used("b", "m", 1, 1, 1)])
        usage.add_usage(conn, usage.bucket_of(NOW - HOUR_S), [Used("a", "m", 5, 50, 10, 1)])
        hour = usage.usage_since(conn, NOW, "key,model")
        both = usage.usage_since(conn, NOW - HOUR_S, "key")
        totals = usage.totals(conn)
    assert hour == [{"key": "a", "model": "m", "requests": 3, "prompt_tokens": 30,
                     "completion_tokens": 6, "refused": 3},
                    {"key": "b", "model": "m", "requests": 1, "prompt_tokens": 1,
                     "completion_tokens": 1, "refused": 0}]
    assert both[0] == {"key": "a", "requests": 8, "prompt_tokens": 80, "completion_tokens": 16,
                       "refused": 4}
    assert totals == [Used("a", "m", 8, 80, 16, 4), Used("b", "m", 1, 1, 1, 0)]


def test_a_report_is_claimed_once_per_reporter_and_seq(store: Store) -> None:
    with store.begin() as conn:
        assert usage.claim_report(conn, "r1", 1, NOW)
        assert not usage.claim_report(conn, "r1", 1, NOW)
        assert usage.claim_report(conn, "r1", 3, NOW)       # a gap: reports were lost
        assert not usage.claim_report(conn, "r1", 2, NOW)
        assert usage.claim_report(conn, "r2", 1, NOW)


def test_old_hours_and_silent_reporters_are_forgotten_and_the_totals_stay(
        store: Store) -> None:
    with store.begin() as conn:
        usage.add_usage(conn, usage.bucket_of(NOW - RETENTION_S - 2 * HOUR_S),
                        [Used("a", "m", 1, 1, 1)])
        usage.add_usage(conn, usage.bucket_of(NOW), [Used("a", "m", 1, 1, 1)])
        usage.claim_report(conn, "old", 7, NOW - REPORTER_TTL_S - 1)
        usage.claim_report(conn, "new", 7, NOW)
        usage.prune(conn, NOW)
        rows = usage.usage_since(conn, 0.0, "key")
        totals = usage.totals(conn)
        assert usage.claim_report(conn, "old", 1, NOW)     # forgotten: numbering anew
        assert not usage.claim_report(conn, "new", 7, NOW)
    assert rows == [{"key": "a", "requests": 1, "prompt_tokens": 1, "completion_tokens": 1,
                     "refused": 0}]
    assert totals == [Used("a", "m", 2, 2, 2)]


def test_counts_stop_at_json_exact_integers_instead_of_overflowing(store: Store) -> None:
    """Issue 28: sums past 64 bits were an OverflowError (500); now every stored count and
    every sum read back saturates at MAX_COUNT (2^53), also summed over many hours."""
    big = usage.MAX_COUNT - 1
    with store.begin() as conn:
        for hours in range(3):
            usage.add_usage(conn, usage.bucket_of(NOW - hours * HOUR_S),
                            [Used("a", "m", 1, big, big, big), Used("a", "m", 1, big, 5)])
        usage.add_usage(conn, usage.bucket_of(NOW), [Used("a", "m", 1, big, big, big)])
        assert usage.usage_since(conn, NOW - 3 * HOUR_S, "key") == [
            {"key": "a", "requests": 7, "prompt_tokens": usage.MAX_COUNT,
             "completion_tokens": usage.MAX_COUNT, "refused": usage.MAX_COUNT}]
        assert usage.totals(conn) == [Used("a", "m", 7, usage.MAX_COUNT, usage.MAX_COUNT,
                                           usage.MAX_COUNT)]


def test_usage_stored_before_0018_reads_no_refusals_and_counts_them_after(
        store: Store) -> None:
    """Migration 0018 adds ``refused`` to rows already there as 0, on both stores."""
    from alembic import command
    from alembic.config import Config

    from llmgw_runtime.store.db import MIGRATIONS

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with store.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0017")
        for table in ("usage", "usage_totals"):
            conn.execute(sa.text(
                f"INSERT INTO {table} ({'bucket, ' if table == 'usage' else ''}key, model, "
                "requests, prompt_tokens, completion_tokens) VALUES "
                f"({str(usage.bucket_of(NOW)) + ', ' if table == 'usage' else ''}"
                "'a', 'm', 1, 2, 3)"))
    assert store.migrate() == "0019"
    with store.begin() as conn:
        assert usage.totals(conn) == [Used("a", "m", 1, 2, 3, 0)]
        usage.add_usage(conn, usage.bucket_of(NOW), [Used("a", "m", 0, 0, 0, 2)])
        assert usage.usage_since(conn, NOW, "key")[0]["refused"] == 2
        assert usage.totals(conn) == [Used("a", "m", 1, 2, 3, 2)]
