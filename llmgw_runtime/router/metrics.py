"""Prometheus metrics of the router, served at ``GET /metrics``.

Under gunicorn (``serve.run``) every worker writes its counters to files in a private
directory (``PROMETHEUS_MULTIPROC_DIR``, made by ``serve.run`` before the workers fork, so
prometheus_client sees it when a worker first imports it) and a scrape of any worker adds
up all of them: prometheus_client's multiprocess mode. Without that directory (an app made
in-process, as tests do) each app has its own plain registry.

A WSGI middleware times each proxied request until its last byte was handed to the server
(the server closes the answer then) and until its first byte; the view names the model
(``(unknown)`` for one not in the routes table, so a client cannot grow the label set)
and the error code it answered with.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, multiprocess, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from ..api.router import FIRST_BYTE_BUCKETS_S
from .proxy import Stream

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
UNKNOWN_MODEL = "(unknown)"
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
# Passed through to the engine as they are: OpenAI's Responses API and Anthropic's Messages
# API (llama.cpp's server serves both); an engine without one answers 404, which the router
# turns into an error naming the engine (router/wsgi.py).
PASSTHROUGH_PATHS = frozenset({"/v1/responses", "/v1/messages"})
PROXIED_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}
                          ) | PASSTHROUGH_PATHS
# From an embedding (milliseconds) to a long generation (minutes).
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0, 600.0)
# Prompt processing, or an on-demand model's activation (up to activation_timeout_s).
TTFB_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0)

WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                120.0, 300.0)

CANCELLED = "client_closed_request"  # the error code of a client that left: not an error
_MODEL = "llmgw.metrics.model"       # request.environ keys the view sets
_ERROR = "llmgw.metrics.error"

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def _pid() -> int:
    """This process's id, kept since the last fork: prometheus_client asks for it on
    every counter and histogram update (multiprocess mode) to notice a fork, and
    ``os.getpid`` is a system call each time (about ten a request)."""
    return _PID[0]


def _value_class() -> Any:
    """prometheus_client's multiprocess value (a float in this worker's file), and in a
    gevent worker without the lock and the fork check it takes on each update: there an
    update runs whole (nothing in it lets another greenlet run) and the worker forks no
    more. gevent's lock is Python code: an update costs 0.54 us without them against 1.03
    us with them (300,000 counter increments under gevent), about 4 us of CPU of a
    proxied request's eight updates (in flight up and down, the count, two histograms'
    bucket and sum, the admission)."""
    base = values.MultiProcessValue(process_identifier=_pid)
    from gevent import monkey

    if not monkey.is_module_patched("threading"):
        return base

    class GreenValue(base):  # type: ignore[misc,valid-type]
        def inc(self, amount: float) -> None:
            self._value += amount
            self._timestamp = 0.0
            self._file.write_value(self._key, self._value, 0.0)

        def set(self, value: float, timestamp: float | None = None) -> None:
            self._value = value
            self._timestamp = timestamp or 0.0
            self._file.write_value(self._key, self._value, self._timestamp)

    return GreenValue


class RouterMetrics:
    """The router's counters, histograms and gauge, and the registry ``/metrics`` shows."""

    def __init__(self, multiproc_dir: str | None = None) -> None:
        multiproc_dir = multiproc_dir or os.environ.get(MULTIPROC_DIR_ENV) or None
        self.registry = CollectorRegistry(auto_describe=False)
        if multiproc_dir:
            if values.ValueClass is values.MutexValue:
                raise RuntimeError(
                    "prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set, "
                    "so each worker would count alone; import it only in the workers")
            values.ValueClass = _value_class()
            # Values live in this worker's files; a scrape reads every worker's.
            multiprocess.MultiProcessCollector(self.registry, path=multiproc_dir)
            owner: CollectorRegistry | None = None
        else:
            owner = self.registry
        self.multiprocess = bool(multiproc_dir)
        self.requests = Counter(
            "llmgw_router_requests", "Requests naming a model, by the HTTP status answered",
            ["model", "code"], registry=owner)
        self.errors = Counter(
            "llmgw_router_errors", "Requests the router refused or failed, by the OpenAI "
            "error code it answered", ["model", "code"], registry=owner)
        self.cancelled = Counter(
            "llmgw_router_client_cancelled", "Requests whose client went away before the "
            "answer ended (not errors: a client's own choice), by when: waiting (for a slot "
            "or the engine's first byte) or streaming", ["model", "when"], registry=owner)
        self.duration = Histogram(
            "llmgw_router_request_duration_seconds",
            "From the request to the last byte of the answer", ["model"],
            buckets=DURATION_BUCKETS, registry=owner)
        self.ttfb = Histogram(
            "llmgw_router_time_to_first_byte_seconds",
            "From the request to the first byte of the answer's body", ["model"],
            buckets=TTFB_BUCKETS, registry=owner)
        self.in_flight = Gauge(
            "llmgw_router_in_flight", "Requests of the model being answered now", ["model"],
            multiprocess_mode="livesum", registry=owner)

        # Admission (admission/gate.py): the queue for a free slot, and what became of each request.
        self.queue_depth = Gauge(
            "llmgw_router_queue_depth", "Requests of the model waiting for a free slot",
            ["model"], multiprocess_mode="livesum", registry=owner)
        self.queue_wait = Histogram(
            "llmgw_router_queue_wait_seconds", "Time a request waited for a slot, whether "
            "it got one or not (requests admitted at once are not counted)", ["model"],
            buckets=WAIT_BUCKETS, registry=owner)
        self.admitted = Counter(
            "llmgw_router_admitted", "Requests given a slot, at once or after waiting",
            ["model", "how"], registry=owner)
        self.rejected = Counter(
            "llmgw_router_rejected", "Requests refused for capacity (queue_full, timeout) "
            "or whose client went away while waiting (client_gone)", ["model", "reason"],
            registry=owner)
        self.fallbacks = Counter(
            "llmgw_router_fallbacks", "Requests for a model served by one of its fallback "
            "models, by why the model could not serve (parked, unplaceable, stopped, "
            "at_capacity)",
            ["model", "fallback", "reason"], registry=owner)
        # A canary rollout's versions (canary.py), counted only while one holds.
        self.version_requests = Counter(
            "llmgw_router_version_requests", "Requests of a model under a canary rollout "
            "by version (stable, canary) and outcome (ok; error: the engine's 5xx, a stream "
            "it broke off, or no replica of the version reached)",
            ["model", "version", "outcome"], registry=owner)
        self.version_first_byte = Histogram(
            "llmgw_router_version_first_byte_seconds", "From the request to the first byte "
            "of the answer, by version of a model under a canary rollout",
            ["model", "version"], buckets=TTFB_BUCKETS, registry=owner)
        # llmgw_router_slots_in_use{model}: read at scrape time (admit.Gate.slots_in_use)
        self.slots_in_use_source: Callable[[], dict[str, int]] | None = None
        self.registry.register(_SlotsInUse(self))
        self._children: dict[tuple[Any, ...], Any] = {}
        # First-byte times per model since the last capacity report, counted per
        # FIRST_BYTE_BUCKETS_S bucket (admission/load.py takes them for the control
        # service's history): this worker's, like its refusals.
        self._first_bytes: dict[str, list[int]] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept: labels() takes a lock and checks its values
        each call, a few microseconds on every request. Label values are models of the
        routes table (or ``(unknown)``), status and error codes: few."""
        key = (metric, *labels)
        found = self._children.get(key)
        if found is None:
            if len(self._children) > 10_000:     # a catalog that churns names: start over
                self._children.clear()
            found = self._children[key] = metric.labels(*labels)
        return found

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------ called by the views

    def model_named(self, environ: dict[str, Any], label: str) -> None:
        """The request is for ``label`` (a routed model or ``(unknown)``): in flight now."""
        if _MODEL not in environ:
            environ[_MODEL] = label
            self.child(self.in_flight, label).inc()

    @staticmethod
    def error_answered(environ: dict[str, Any], code: str) -> None:
        environ[_ERROR] = code

    # ------------------------------------------------------------ called by the middleware

    def finished(self, environ: dict[str, Any], status: str, duration_s: float) -> None:
        model = environ.get(_MODEL)
        label = model or UNKNOWN_MODEL
        self.child(self.requests, label, status).inc()
        self.child(self.duration, label).observe(duration_s)
        error = environ.get(_ERROR)
        if error == CANCELLED:
            self.child(self.cancelled, label, "waiting").inc()
        elif error:
            self.child(self.errors, label, error).inc()
        if model is not None:
            self.child(self.in_flight, model).dec()

    def first_byte(self, environ: dict[str, Any], ttfb_s: float) -> None:
        model = environ.get(_MODEL) or UNKNOWN_MODEL
        self.child(self.ttfb, model).observe(ttfb_s)
        if model != UNKNOWN_MODEL and _ERROR not in environ:    # answered: counted
            counts = self._first_bytes.get(model)
            if counts is None:
                counts = self._first_bytes[model] = [0] * (len(FIRST_BYTE_BUCKETS_S) + 1)
            counts[bisect_left(FIRST_BYTE_BUCKETS_S, ttfb_s)] += 1

    def take_first_bytes(self) -> dict[str, list[int]]:
        """The first-byte counts per model since the last call (FIRST_BYTE_BUCKETS_S
        buckets, len + 1 counts: a time is counted in the first bucket whose bound it
        does not pass, the last counts those above them all), and starts again. Requests
        the router answered with an error of its own are not counted."""
        taken, self._first_bytes = self._first_bytes, {}
        return taken


class _SlotsInUse(Collector):
    """``llmgw_router_slots_in_use``: read from the shared slot counts at each scrape (the
    same in every worker: the counts are the router's), never counted per request."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("llmgw_router_slots_in_use", "Slots of the model's "
                                   "replicas this router's requests hold now", labels=["model"])
        source = self._metrics.slots_in_use_source
        for model, n in sorted((source() if source is not None else {}).items()):
            family.add_metric([model], n)
        yield family


class MetricsMiddleware:
    """Counts and times the proxied routes; every other path goes straight through."""

    def __init__(self, app: WSGIApp, metrics: RouterMetrics) -> None:
        self._app = app
        self._metrics = metrics

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        if environ.get("PATH_INFO") not in PROXIED_PATHS:
            return self._app(environ, start_response)
        started = time.perf_counter()
        status = ["500"]

        def start(status_line: str, headers: Any, exc_info: Any = None) -> Any:
            status[0] = status_line[:3]
            return start_response(status_line, headers, exc_info)

        try:
            body = self._app(environ, start)
        except BaseException:
            self._metrics.finished(environ, "500", time.perf_counter() - started)
            raise
        if isinstance(body, Stream):     # tapped, not wrapped: the relay sees the stream
            metrics = self._metrics
            also = body.first_byte       # a canary's version counts its own (canary.py)

            def first_byte() -> None:
                metrics.first_byte(environ, time.perf_counter() - started)
                if also is not None:
                    also()

            def finished() -> None:
                if body.outcome == "open":
                    label = environ.get(_MODEL) or UNKNOWN_MODEL
                    metrics.child(metrics.cancelled, label, "streaming").inc()
                metrics.finished(environ, status[0], time.perf_counter() - started)
            body.first_byte = first_byte
            body.on_close(finished)
            return body
        took = time.perf_counter() - started    # a whole answer in hand (a list): done now
        if isinstance(body, list) and any(body):
            self._metrics.first_byte(environ, took)
        self._metrics.finished(environ, status[0], took)
        return body
