"""Traces of the control service (OpenTelemetry), when ``LLMGW_OTEL_ENDPOINT`` is set:
a span for each web request and one for each reconciler pass (``llmgw_runtime/tracing.py``
sends them; off by default, and then nothing here imports opentelemetry).

A web request's span (SERVER, continuing the caller's ``traceparent`` when it sent one) is
named by its method and route (``GET /api/v1/models/<name>``: the rule, never the path's
values or its query) and carries http.request.method, http.route and
http.response.status_code; an answer of 500 or more, or an exception, is its error. A
reconciler pass's span (``reconcile pass``) says whether this instance led
(llmgw.leader). A failure is the span's error: status ERROR and an exception event with
the error's type, and its message when it is llmgw's own (``tracing.record_error``).
"""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask, Response, g, request

from .. import tracing
from .config import ControlConfig

WEB_SERVICE = "llmgw-control"
RECONCILER_SERVICE = "llmgw-reconciler"
_SPAN = "llmgw_span"      # flask.g: the request's span


def install(app: Flask, config: ControlConfig) -> None:
    """Spans of ``app``'s requests when ``config.otel_endpoint`` is set; else nothing.
    Call it before other hooks are added, so the span covers theirs."""
    if not config.otel_endpoint:
        return
    from opentelemetry.trace import SpanKind, Status, StatusCode

    tracer = tracing.tracer(WEB_SERVICE, config.otel_endpoint, config.otel_sample_ratio)

    @app.before_request
    def _begin() -> None:
        rule = request.url_rule.rule if request.url_rule is not None else None
        attributes = {"http.request.method": request.method}
        if rule is not None:
            attributes["http.route"] = rule
        g.setdefault(_SPAN, tracer.start_span(
            f"{request.method} {rule or '(no route)'}", kind=SpanKind.SERVER,
            context=tracing.context_of(request.environ), attributes=attributes))

    @app.after_request
    def _answered(response: Response) -> Response:
        span = g.get(_SPAN)
        if span is not None:
            span.set_attribute("http.response.status_code", response.status_code)
            if response.status_code >= 500:
                span.set_status(Status(StatusCode.ERROR, f"answered {response.status_code}"))
        return response

    @app.teardown_request
    def _end(exc: BaseException | None) -> None:
        span = g.pop(_SPAN, None)
        if span is None:
            return
        if exc is not None:
            tracing.record_error(span, exc)
        span.end()


class Passes:
    """Reconciler passes, each in a span (:meth:`run`)."""

    def __init__(self, config: ControlConfig) -> None:
        self._tracer = tracing.tracer(RECONCILER_SERVICE, config.otel_endpoint,
                                      config.otel_sample_ratio)

    def run(self, cycle: Callable[[], bool], holder: str) -> bool:
        """``cycle()`` (one pass: whether it led) in a ``reconcile pass`` span."""
        span = self._tracer.start_span("reconcile pass",
                                       attributes={"llmgw.reconciler": holder})
        try:
            led = cycle()
        except BaseException as exc:
            tracing.record_error(span, exc)
            raise
        else:
            span.set_attribute("llmgw.leader", led)
            return led
        finally:
            span.end()


def passes(config: ControlConfig) -> Passes | None:
    """The reconciler's pass spans when ``otel_endpoint`` is set, else None."""
    return Passes(config) if config.otel_endpoint else None

