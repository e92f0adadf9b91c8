"""The fleet's history the control service keeps (control/history.py, store/history.py,
GET /api/v1/history): each minute's point is what status showed then, the routers'
answered and refused requests and first-byte times add up, hours roll up and old rows
go, on the real store (SQLite and PostgreSQL) with the reconciler's clock."""

from __future__ import annotations

import time
from typing import Any

import pytest

from llmgw_runtime.api.fields import MAX_LIST
from llmgw_runtime.api.history import HOUR_S, MAX_POINTS, MINUTE_S, MINUTES_KEPT_S
from llmgw_runtime.control import history
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.store import Store
from llmgw_runtime.store import history as stored
from llmgw_runtime.store.failover import StoreUnavailable

from .conftest import ADMIN, ROUTER, Api
from .test_openapi import checker

CATALOG = """models:
  - name: tiny
    source: file:///models/tiny.gguf
    engine: llama.cpp
    profile: {class: cpu}
    slots: 2
    replicas: {min: 1, max: 3}
  - name: fixed
    source: file:///models/fixed.gguf
    engine: llama.cpp
    profile: {class: cpu}
    replicas: 2
"""
# first-byte counts per api.router.FIRST_BYTE_BUCKETS_S bucket (0.05, 0.1, 0.25, ... 60)
FAST = [0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0]            # 2 in (0.05, 0.1], 1 in (0.1, 0.25]
SLOW = [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1]            # 1 in (1, 2.5], 1 above 60 s
T0 = 1_800_000_000.0                                # an hour's start (store clock)


def at(store: Store, t: float) -> None:
    """The store's clock (the reconciler's, and the web's through its offset) reads
    ``t`` now and runs on from there."""
    base = time.time()
    store.now = lambda conn: t + (time.time() - base)       # type: ignore[method-assign]
    store._clock_offset = (0.0, -1e9)                       # measured again at once


def load(**kw: Any) -> dict[str, Any]:
    return {"waiting": 0, "in_flight": 0, "slots": 2, "rejected": 0, "wait_p90_s": 0.0,
            "busy": 0, "oldest_wait_s": 0.0, "queued": 0, "at_capacity": False, **kw}


def post(api: Api, router: str, **models: dict[str, Any]) -> None:
    resp = api.call("POST", "/api/v1/idle", ROUTER,
                    json={"replicas": {}, "capacity": models, "router": router})
    assert resp.status_code == 204, resp.json


# ---------------------------------------------------------------- pure


def test_quantiles_are_interpolated_from_the_bucket_counts() -> None:
    assert history.quantile([0] * 11, 0.5) is None
    assert history.quantile(FAST, 0.5) == pytest.approx(0.0875)   # rank 1.5 of 3 in (.05,.1]
    assert history.quantile(FAST, 0.9) == pytest.approx(0.205)    # rank 2.7: (.1,.25] at .7
    both = stored.add_counts(list(FAST), SLOW)
    assert history.quantile(both, 0.5) == pytest.approx(0.175)   # rank 2.5 of 5
    assert history.quantile(both, 0.9) == 60.0       # above the last bound: the last bound


def test_minutes_aggregate_into_hours_gauges_the_most_counts_summed() -> None:
    row = {"model": "m", "ready": 1, "wanted": 2, "waiting": 3, "busy": 1, "slots": 2,
           "refused": 1, "requests": 3, "first_byte": FAST}
    rows = [{**row, "t": T0}, {**row, "t": T0 + 60, "ready": 2, "waiting": 0,
                               "requests": 2, "first_byte": SLOW},
            {**row, "t": T0 + HOUR_S}]
    first, second = history.aggregate_models(rows, HOUR_S)
    assert (first["t"], first["ready"], first["waiting"], first["requests"],
            first["refused"]) == (T0, 2, 3, 5, 2)
    assert first["first_byte"] == stored.add_counts(list(FAST), SLOW)
    assert second["t"] == T0 + HOUR_S and second["requests"] == 3


def test_which_hours_roll_up_and_which_rows_are_forgotten() -> None:
    now = T0 + 2 * HOUR_S + 30
    # with none rolled yet, from the first whole hour whose minutes are all kept
    assert history.roll_span(None, now, 14) == (T0 + 3 * HOUR_S - MINUTES_KEPT_S, T0 + HOUR_S)
    assert history.roll_span(T0, now, 14) is None     # the next hour ended 30 s ago: wait
    assert history.roll_span(T0, now + 60, 14) == (T0 + HOUR_S, T0 + 2 * HOUR_S)
    assert history.roll_span(None, now, 0.5)[0] == T0 + 3 * HOUR_S - 12 * HOUR_S  # type: ignore[index]
    assert history.prune_before(now, 14) == (now - MINUTES_KEPT_S, now - 14 * 86_400)
    assert min(history.prune_before(now, 0)) > now      # 0 keeps nothing


def test_an_answer_names_at_most_max_list_series_those_heard_of_last() -> None:
    rows = [{"model": f"m{i:05d}", "t": T0 + i} for i in range(MAX_LIST + 2)]
    kept = history.series(rows, "model")
    assert len(kept) == MAX_LIST and "m00000" not in kept and "m00001" not in kept
    assert list(kept) == sorted(kept)


def test_history_days_out_of_range_is_refused_at_start() -> None:
    assert not [p for p in ControlConfig().validate() if "HISTORY" in p]
    for days in (-1.0, float("nan"), 4000.0):
        [problem] = [p for p in ControlConfig(history_days=days).validate() if "HISTORY" in p]
        assert "LLMGW_HISTORY_DAYS" in problem and "0 (keep no history)" in problem


class DownStore:
    """A store whose transactions fail: counts how often the recorder opens one."""

    def __init__(self) -> None:
        self.begun = 0

    def begin(self) -> Any:
        self.begun += 1
        raise StoreUnavailable("the store cannot be reached: test")


def test_the_recorder_opens_one_transaction_a_minute_and_never_fails_the_pass(
        caplog: pytest.LogCaptureFixture) -> None:
    recorder, down = history.Recorder(14, 30), DownStore()
    for now in (T0 + 1, T0 + 2, T0 + 59, T0 + 60, T0 + 61, T0 + 121):
        recorder.tick(down, now)                          # type: ignore[arg-type]
    assert down.begun == 3                                # minutes T0, T0+60, T0+120
    assert len([r for r in caplog.records if "not recorded" in r.message]) == 1


# ---------------------------------------------------------------- the store


def test_posts_add_up_in_their_minute_and_hours_roll_up_then_go(store: Store) -> None:
    with store.begin() as conn:
        for minute, counts, refused in ((T0, FAST, 1), (T0, SLOW, 0), (T0 + 60, FAST, 2)):
            stored.add_post(conn, "m", minute, requests=sum(counts), refused=refused,
                            first_byte=counts, waiting=2 if refused else 5, busy=1)
        stored.put_minute(conn, T0, [{"model": "m", "ready": 1, "wanted": 1, "waiting": 3,
                                      "busy": 0, "slots": 2}],
                          [{"device_class": "cpu", "devices": 1, "used": 1, "replicas": 1}])
        stored.add_post(conn, "m", T0 + HOUR_S, requests=1, refused=0,
                        first_byte=[1] + [0] * 10, waiting=0, busy=0)
        [one, two] = stored.model_rows(conn, MINUTE_S, T0, T0 + HOUR_S)
    assert (one["requests"], one["refused"], one["first_byte"]) == (
        5, 1, stored.add_counts(list(FAST), SLOW))
    assert (one["ready"], one["slots"], one["waiting"], one["busy"]) == (1, 2, 5, 1)
    assert (two["requests"], two["refused"], two["waiting"]) == (3, 2, 2)

    # an hour and a minute later the first hour is rolled up; its minutes stay two days
    with store.begin() as conn:
        history.record_minute(conn, T0 + 2 * HOUR_S + 61, 14, 30)
        week = history.history(conn, T0 + 2 * HOUR_S + 61, "7d")
        day = history.history(conn, T0 + 2 * HOUR_S + 61, "24h")
        assert stored.last_hour(conn) == T0 + HOUR_S
    rolled, current = week.models["m"]
    assert (rolled.t, rolled.requests, rolled.refused, rolled.ready, rolled.waiting) == (
        T0, 8, 3, 1, 5)
    assert rolled.first_byte_p50_s == round(history.quantile(       # type: ignore[arg-type]
        stored.add_counts(stored.add_counts(list(FAST), SLOW), FAST), 0.5), 4)
    assert (current.t, current.requests, current.first_byte_p90_s) == (T0 + HOUR_S, 1, 0.045)
    assert [c.devices for c in week.classes["cpu"]] == [1]
    assert week.step_s == HOUR_S and day.step_s == MINUTE_S
    assert [p.t for p in day.models["m"]] == [T0, T0 + 60, T0 + HOUR_S]
    with store.begin() as conn:                      # a page drawing the classes only
        classes = history.history(conn, T0 + 2 * HOUR_S + 61, "7d", with_models=False)
    assert classes.models == {} and classes.classes == week.classes

    # the hour rolled again gives the same; past two days the minutes go, the hours stay
    with store.begin() as conn:
        history.record_minute(conn, T0 + 2 * HOUR_S + MINUTES_KEPT_S, 14, 30)
        assert stored.model_rows(conn, MINUTE_S, 0, T0 + 3 * HOUR_S) == []
        [hour, next_hour] = stored.model_rows(conn, HOUR_S, 0, T0 + 3 * HOUR_S)
        assert (hour["requests"], next_hour["requests"]) == (8, 1)
        history.record_minute(conn, T0 + 15 * 86_400, 14, 30)
        assert stored.model_rows(conn, HOUR_S, 0, T0 + 3 * HOUR_S) == []
        stored.add_post(conn, "m", T0, requests=1, refused=0, first_byte=FAST,
                        waiting=0, busy=0)
        history.record_minute(conn, T0 + 60, 0, 30)      # history_days 0: nothing kept
        assert stored.model_rows(conn, MINUTE_S, 0, T0 + 86_400) == []


def test_an_answer_holds_at_most_max_points_per_series(store: Store) -> None:
    now = T0 + 3 * 86_400 + 30
    rows = [{"model": "m", "ready": 1}]
    with store.begin() as conn:
        for i in range(MAX_POINTS + 20):
            stored.put_minute(conn, T0 + 3 * 86_400 - i * MINUTE_S, rows, [])
        answer = history.history(conn, now, "24h")
    points = answer.models["m"]
    assert len(points) == MAX_POINTS and points[-1].t == T0 + 3 * 86_400
    assert points[0].t == answer.since == T0 + 2 * 86_400


# ---------------------------------------------------------------- through the service


def ready(api: Api) -> tuple[str, str]:
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    cred = api.join()
    api.report(cred)
    api.reconciler.run_cycle()
    tiny = [a for a in api.report(cred).json["assignments"] if a["model"] == "tiny"]
    return str(tiny[0]["replica_id"]), cred


def test_each_minute_records_what_status_shows_and_the_routers_counts(api: Api) -> None:
    rid, cred = ready(api)
    minute = stored.period_of(time.time(), MINUTE_S) + MINUTE_S
    at(api.store, minute + 1)                 # the reconciler's next minute, 59 s ahead
    api.report(cred, replicas=[{"id": rid, "state": "ready", "port": 41000, "pid": 1}])
    post(api, "rt-a", tiny=load(waiting=2, busy=1, in_flight=1, rejected=3,
                                at_capacity=True, first_byte=FAST))
    post(api, "rt-b", tiny=load(busy=1, in_flight=1, first_byte=SLOW))
    api.reconciler.run_cycle()
    status = api.call("GET", "/api/v1/status").json
    answer = api.call("GET", "/api/v1/history?range=24h").json
    [tiny] = [m for m in status["models"] if m["name"] == "tiny"]
    [fixed] = [m for m in status["models"] if m["name"] == "fixed"]
    point = answer["models"]["tiny"][-1]
    assert point["t"] == minute
    assert (point["ready"], point["wanted"]) == (tiny["ready"], tiny["wanted"]) == (1, 1)
    signal = tiny["scaling"]["signal"]
    assert (point["waiting"], point["busy"], point["slots"]) == (
        signal["waiting"], signal["busy"], signal["slots"]) == (2, 2, 2)
    assert (point["requests"], point["refused"]) == (5, 3)
    both = stored.add_counts(list(FAST), SLOW)
    assert point["first_byte_p50_s"] == round(history.quantile(both, 0.5), 4)  # type: ignore[arg-type]
    assert point["first_byte_p90_s"] == 60.0
    assert answer["models"]["fixed"][-1]["wanted"] == fixed["wanted"] == 2
    cpu = status["devices"]["cpu"]
    assert answer["classes"]["cpu"][-1] == {"t": minute,
                                             "devices": cpu["total"] - cpu["unreachable"],
                                             "used": cpu["used"], "replicas": 1}
    assert cpu["used"] == 1

    # the same pass again in the minute writes nothing new; the endpoint's errors
    api.reconciler.run_cycle()
    one = api.call("GET", "/api/v1/history?range=7d&model=tiny").json
    assert one["step_s"] == HOUR_S and not one.get("classes")
    assert one["models"]["tiny"][-1]["requests"] == 5
    for query, name in (("range=1h", "range"), ("model=nope", "model"),
                        ("model=a%20b", "model")):
        resp = api.call("GET", f"/api/v1/history?{query}")
        assert resp.status_code == 400 and f"{name}=" in resp.json["error"]["message"]
    assert api.call("GET", "/api/v1/history", ROUTER).status_code in (401, 403)
    doc = api.call("GET", "/openapi.json", ADMIN).json
    checker(doc)(api.call("GET", "/api/v1/history?range=7d"), "/api/v1/history", "get")
