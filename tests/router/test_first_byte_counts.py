"""What a router counts of first-byte times for the control service's history
(router/metrics.py ``first_byte``, admission/load.py ``Gate.capacity``): each answered
request's time in its FIRST_BYTE_BUCKETS_S bucket, per model, since the last report;
the router's own error answers not counted; a model answered in the interval is posted
though nothing is in flight or waiting any more."""

from __future__ import annotations

from typing import Any

from llmgw_runtime.api.router import FIRST_BYTE_BUCKETS_S, Endpoint
from llmgw_runtime.router.admission.gate import Gate
from llmgw_runtime.router.metrics import MetricsMiddleware, RouterMetrics
from llmgw_runtime.router.tables.slots import LocalSlots

EPS = (Endpoint(replica_id="r1", url="http://e:1", slots=3),)


def answering(metrics: RouterMetrics, model: str, error: str | None = None) -> Any:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        metrics.model_named(environ, model)
        if error is not None:
            metrics.error_answered(environ, error)
        start_response("429 Too Many Requests" if error else "200 OK", [])
        return [b"{}"]
    return MetricsMiddleware(app, metrics)


def call(app: Any) -> None:
    app({"PATH_INFO": "/v1/chat/completions"}, lambda *a: None)


def test_answered_requests_are_counted_per_bucket_and_posted_once() -> None:
    metrics = RouterMetrics()
    gate = Gate(metrics, (1, 1), counts=LocalSlots(), clock=lambda: 1.0)
    gate.admit("m", EPS, "-", "normal", None, 5, 30.0).release()  # type: ignore[attr-defined]
    [admitted] = gate.capacity().values()                # admitted, answered later
    assert "first_byte" not in admitted.to_json()        # none answered: not even named
    for _ in range(3):
        call(answering(metrics, "m"))                    # a whole answer: ~0 s
    call(answering(metrics, "m", error="model_at_capacity"))   # the router's own refusal
    call(answering(metrics, "(unknown)"))
    metrics.first_byte({"llmgw.metrics.model": "m"}, 0.3)
    metrics.first_byte({"llmgw.metrics.model": "m"}, 61.0)
    [(name, report)] = gate.capacity().items()           # nothing in flight: still posted
    assert name == "m" and report.at_capacity is False
    assert len(report.first_byte) == len(FIRST_BYTE_BUCKETS_S) + 1
    assert report.first_byte[0] == 3 and report.first_byte[3] == 1   # (0.25, 0.5]
    assert report.first_byte[-1] == 1 and sum(report.first_byte) == 5
    assert gate.capacity() == {}                         # counted once
