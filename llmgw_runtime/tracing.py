"""OpenTelemetry traces, shared by the router (``router/tracing.py``) and the control
service (``control/tracing.py``): off unless an OTLP endpoint is set (``LLMGW_OTEL_ENDPOINT``).

Nothing here imports opentelemetry at import time: :func:`tracer` does, the first time a
process that has the setting asks for one, so a router or control service without it
never loads the SDK. A tracer's spans go to ``<endpoint>/v1/traces`` over OTLP/HTTP
(protobuf) in batches (the SDK's BatchSpanProcessor, whose thread is a greenlet in a
gevent worker), sampled by trace id: ParentBased(TraceIdRatioBased(ratio)), so a request
whose client sent a ``traceparent`` keeps the client's decision and any other is kept with
probability ``ratio``. The SDK's own ``OTEL_EXPORTER_OTLP_TRACES_HEADERS`` (a collector's
token), ``..._CERTIFICATE`` (its CA) and ``OTEL_BSP_*`` (batch sizes and delay) apply.

A process makes its tracer after gunicorn forked it (the apps are made in the workers) and
flushes it as it exits (:func:`shutdown`, from the servers' ``worker_exit`` hooks; the SDK
also flushes at interpreter exit).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from . import __version__
from .errors import LlmgwError

TRACES_PATH = "/v1/traces"      # OTLP/HTTP's path for spans, added to a bare endpoint
ENDPOINT_ENV = "LLMGW_OTEL_ENDPOINT"
RATIO_ENV = "LLMGW_OTEL_SAMPLE_RATIO"
# W3C trace context: the request headers a trace continues from (WSGI environ keys)
_CARRIED = (("traceparent", "HTTP_TRACEPARENT"), ("tracestate", "HTTP_TRACESTATE"))

_providers: list[Any] = []      # this process's TracerProviders, flushed by shutdown()
_propagator: list[Any] = []


def problems(endpoint: str, ratio: float) -> list[str]:
    """What is wrong with the tracing settings, as messages that say what to set."""
    out = []
    if endpoint:
        parts = urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            out.append(f"{ENDPOINT_ENV}={endpoint!r} is not an http(s) URL: set it to the "
                       "OTLP/HTTP receiver of your collector, e.g. http://collector:4318 "
                       "(or leave it empty: no traces)")
    if not 0 <= ratio <= 1:
        out.append(f"{RATIO_ENV}={ratio:g} must be from 0 to 1 (the share of traces kept; "
                   "1 keeps every one)")
    return out


def traces_url(endpoint: str) -> str:
    """The URL spans are posted to: ``endpoint`` itself when it names a path, else its
    ``/v1/traces`` (as a collector's base URL, http://collector:4318, is usually given)."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return endpoint.rstrip("/") + TRACES_PATH
    return endpoint


def tracer(service: str, endpoint: str, ratio: float) -> Any:
    """A tracer whose spans go to ``endpoint`` (OTLP/HTTP, batched), as ``service``
    (``service.name``) of this host; sampled at ``ratio`` unless a parent decided.
    Imports the SDK: call it only when tracing is on, after any fork."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    resource = Resource.create({"service.name": service, "service.version": __version__,
                                "host.name": socket.gethostname()})
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)),
                              resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(
        endpoint=traces_url(endpoint))))
    _providers.append(provider)
    return provider.get_tracer("llmgw", __version__)


def shutdown() -> None:
    """Send the spans this process still holds and stop its tracers (a worker exiting);
    nothing when it made none."""
    while _providers:
        _providers.pop().shutdown()


def context_of(environ: Mapping[str, Any]) -> Any:
    """The trace context a request's ``traceparent`` and ``tracestate`` name (an empty
    one, a new trace, when it sent none or a malformed one)."""
    carrier = {name: environ[key] for name, key in _CARRIED if environ.get(key)}
    return _w3c().extract(carrier)


def carried(span: Any) -> dict[str, str]:
    """The ``traceparent`` (and ``tracestate``) that make ``span`` the parent of what
    the next hop does."""
    from opentelemetry.trace import set_span_in_context

    out: dict[str, str] = {}
    _w3c().inject(out, set_span_in_context(span))
    return out


def _w3c() -> Any:
    """W3C trace context's propagator (made once, at first use)."""
    if not _propagator:
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )
        _propagator.append(TraceContextTextMapPropagator())
    return _propagator[0]


def record_error(span: Any, error: BaseException | str) -> None:
    """``span`` failed: status ERROR and an ``exception`` event. An llmgw error's message
    is llmgw's own (what a client was answered, what a log says) and goes with it; any
    other exception's is not sent (it may quote data: a statement, a body), only its
    type: the log on the host has the rest."""
    from opentelemetry.trace import Status, StatusCode

    if isinstance(error, LlmgwError):
        code = getattr(error, "code", None) or error.reason
        kind, why = type(error).__name__, f"{code}: {error.message}"
    elif isinstance(error, BaseException):
        kind = type(error).__name__
        why = f"{kind} (the log on its host says more)"
    else:
        kind, why = "", error
    span.add_event("exception", {"exception.type": kind, "exception.message": why}
                   if kind else {"exception.message": why})
    span.set_status(Status(StatusCode.ERROR, why))
