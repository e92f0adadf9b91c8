"""Request traces of the router (OpenTelemetry), when ``LLMGW_OTEL_ENDPOINT`` is set.

Off (the default) nothing here runs: :class:`~.wsgi.ProxiedRoutes` looks once per request
whether it has a :class:`RouterTracing` and opentelemetry is never imported. A client's
``traceparent`` and ``tracestate`` go on to the engine as they came, like its other
headers (``proxy.upstream_headers``).

On, each worker makes its tracer as its app is made (after gunicorn forked it: its
batch processor's thread is a greenlet there) and flushes it as it exits (``serve.py``).
A proxied request is one trace, continuing the client's ``traceparent`` when it sent one::

    POST /v1/chat/completions   SERVER: http.request.method, url.path, llmgw.model,
                                llmgw.key.id (the first 16 hex digits of the key's
                                SHA-256; "-" without a key) and llmgw.key.name (a key
                                with limits: the table names it), llmgw.replica,
                                llmgw.stream, http.response.status_code,
                                gen_ai.usage.input_tokens / output_tokens at the end;
                                events "first byte", "stream end" (tokens, outcome)
      key check                 the API key's check (a refusal is its error)
      admission                 per try: the wait for a slot (queue wait: its length,
                                llmgw.queue.wait_s) and the decision: llmgw.replica and
                                llmgw.admission.reason ("affinity": the prefix's
                                remembered home, its cache likely there; "load": the
                                replica with the most room, or placed by bounded load)
      upstream                  CLIENT, per try: from the connection to the engine to the
                                answer's end; event "answer head" (its status). The
                                engine is sent a traceparent naming this span.

A request the router refused or failed has status ERROR and an exception event (the
error's type and the message the client was answered; an unexpected failure's type only:
``tracing.record_error``); an engine's 5xx and a stream it broke off too; a client
that went away is an event ("client went away"), not an error. Spans carry names and
numbers: model, replica, key name, codes and token counts, never a key, a prompt or an
answer.

Hooks: the request span is begun and ended here (:meth:`RouterTracing.request`); the key
check and the forward to an engine are wrapped in this worker's state when tracing is on
(:meth:`RouterTracing._wrap`), so the request path has no tracing code when it is off.
Nothing runs per chunk of a stream: its first byte and its close only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from .. import tracing
from ..api.router import Endpoint
from .errors import ClientGone
from .proxy import Admit, Answered, Slot, Stream
from .tokens import Tokens, usage_in_body
from .usage import KEY_ID

if TYPE_CHECKING:
    from .routes import RoutesTable
    from .state import RouterState

SERVICE = "llmgw-router"
FAILED = "llmgw.trace.failed"     # environ: the error the request was answered with
KEY_ID_DIGITS = 16                # of the key's SHA-256, as llmgw.key.id
_TRACE = "llmgw.trace"            # environ: the request's _Trace
# the request being served in this greenlet (each has its own context): the forward sees it
_CURRENT: ContextVar[_Trace | None] = ContextVar("llmgw_router_trace", default=None)

Serve = Callable[[dict[str, Any], Callable[..., Any], str], Iterable[bytes]]


def for_router(state: RouterState) -> RouterTracing | None:
    """The worker's tracing when ``otel_endpoint`` is set, else None (nothing imported)."""
    if not state.config.otel_endpoint:
        return None
    return RouterTracing(state)


class _Trace:
    """One request's spans: its own, and its current try's upstream span."""

    __slots__ = ("span", "context", "upstream")

    def __init__(self, span: Any, context: Any) -> None:
        self.span = span
        self.context = context
        self.upstream: Any = None


class RouterTracing:
    """The spans of this worker's proxied requests (module docstring)."""

    def __init__(self, state: RouterState) -> None:
        from opentelemetry.trace import SpanKind, set_span_in_context

        config = state.config
        self._tracer = tracing.tracer(SERVICE, config.otel_endpoint, config.otel_sample_ratio)
        self._server, self._client = SpanKind.SERVER, SpanKind.CLIENT
        self._in_context = set_span_in_context
        self._wrap(state)

    # -- the request -----------------------------------------------------------------

    def request(self, environ: dict[str, Any], start_response: Callable[..., Any],
                path: str, serve: Serve) -> Iterable[bytes]:
        """``serve(environ, start_response, path)`` in the request's span, ended with its
        answer (a stream's at its close)."""
        method = environ.get("REQUEST_METHOD") or "-"
        span = self._tracer.start_span(
            f"{method} {path}", context=tracing.context_of(environ), kind=self._server,
            attributes={"http.request.method": method, "url.path": path})
        trace = environ[_TRACE] = _Trace(span, self._in_context(span))
        status = [500]

        def start(line: str, headers: Any, exc_info: Any = None) -> Any:
            status[0] = int(line[:3])
            return start_response(line, headers, exc_info)

        token = _CURRENT.set(trace)
        try:
            body = serve(environ, start, path)
        except BaseException as exc:      # the worker stopping: the request ends here
            self._failed(span, exc)
            self._end_upstream(trace, exc)
            span.end()
            raise
        finally:
            _CURRENT.reset(token)
        span.set_attribute("http.response.status_code", status[0])
        failed = environ.get(FAILED)
        if failed is not None:
            if isinstance(failed, ClientGone):
                span.add_event("client went away")
            else:
                self._failed(span, failed)
        elif status[0] >= 500:
            self._failed(span, f"the engine answered {status[0]}")
        if isinstance(body, Stream):
            self._watch(trace, body)
        else:
            if span.is_recording() and 200 <= status[0] < 300 and isinstance(body, list):
                self._tokens(span, usage_in_body(path, b"".join(body)))
            self._end_upstream(trace, None)
            span.end()
        return body

    def _watch(self, trace: _Trace, stream: Stream) -> None:
        """The stream's first byte and its end, on the request's spans."""
        span, also = trace.span, stream.first_byte

        def first_byte() -> None:
            span.add_event("first byte")
            if also is not None:
                also()

        def closed() -> None:
            outcome = stream.outcome
            tokens = getattr(stream.scan, "tokens", None)
            self._tokens(span, tokens)
            span.add_event("stream end", {"llmgw.outcome": outcome, **_counts(tokens)})
            broken = None
            if outcome == "broken":
                broken = "the engine broke off its answer"
                self._failed(span, broken)
            elif outcome == "open":
                span.add_event("client went away")
            self._end_upstream(trace, broken)
            span.end()

        stream.first_byte = first_byte
        stream.on_close(closed)

    # -- the steps inside it, wrapped when tracing is on --------------------------------

    def _wrap(self, state: RouterState) -> None:
        check, forward = state.check_api_key, state.upstreams.forward

        def check_api_key(table: RoutesTable, environ: dict[str, Any]) -> None:
            trace: _Trace | None = environ.get(_TRACE)
            if trace is None:             # a Flask route (GET /v1/models): not traced
                return check(table, environ)
            span = self._tracer.start_span("key check", context=trace.context)
            try:
                check(table, environ)
            except BaseException as exc:
                self._failed(span, exc)
                raise
            finally:
                span.end()
            key_id = environ.get(KEY_ID) or "-"
            limit = table.key_limits.get(key_id)
            if limit is not None:
                trace.span.set_attribute("llmgw.key.name", limit.name)
            trace.span.set_attribute("llmgw.key.id", key_id[:KEY_ID_DIGITS])

        def forward_traced(model: str, endpoints: Sequence[Endpoint], path: str,
                           body: bytes, headers: dict[str, str], admit: Admit) -> Answered:
            trace = _CURRENT.get()
            if trace is None:
                return forward(model, endpoints, path, body, headers, admit)
            trace.span.set_attribute("llmgw.model", model)
            try:
                answer = forward(model, endpoints, path, body, headers,
                                 self._admitter(trace, admit, path, headers))
            except BaseException as exc:
                self._end_upstream(trace, exc)
                raise
            upstream = trace.upstream
            if upstream is not None:
                upstream.set_attribute("http.response.status_code", answer.status)
                upstream.add_event("answer head", {"http.response.status_code":
                                                   answer.status})
                if answer.status >= 500:
                    self._failed(upstream, f"the engine answered {answer.status}")
                if not isinstance(answer.body, Stream):    # a whole answer: in hand
                    self._end_upstream(trace, None)
            ctype = next((v for k, v in answer.headers if k.lower() == "content-type"), "")
            trace.span.set_attribute("llmgw.stream", ctype.startswith("text/event-stream"))
            return answer

        state.check_api_key = check_api_key             # type: ignore[method-assign]
        state.upstreams.forward = forward_traced        # type: ignore[method-assign]

    def _admitter(self, trace: _Trace, admit: Admit, path: str,
                  headers: dict[str, str]) -> Admit:
        """``admit`` in an admission span; the slot it gives begins an upstream span,
        whose traceparent the engine is sent. A second try ends the first's as failed."""

        def traced(endpoints: Sequence[Endpoint]) -> Slot | None:
            self._end_upstream(trace, "the replica failed before answering; tried again")
            span = self._tracer.start_span("admission", context=trace.context)
            started = time.perf_counter()
            try:
                slot = admit(endpoints)
            except BaseException as exc:   # at capacity, the client gone
                span.set_attribute("llmgw.queue.wait_s", time.perf_counter() - started)
                self._failed(span, exc)
                span.end()
                raise
            span.set_attribute("llmgw.queue.wait_s", time.perf_counter() - started)
            if slot is None:
                span.set_attribute("llmgw.admission.reason", "no replica")
                span.end()
                return None
            ep = slot.endpoint
            span.set_attributes({"llmgw.replica": ep.replica_id, "llmgw.admission.reason":
                                 "affinity" if getattr(slot, "at_home", False) else "load"})
            span.end()
            upstream = trace.upstream = self._tracer.start_span(
                "upstream", context=trace.context, kind=self._client,
                attributes={"llmgw.replica": ep.replica_id, "url.full": ep.url + path})
            trace.span.set_attribute("llmgw.replica", ep.replica_id)
            headers.pop("Traceparent", None)     # the client's: the engine's parent is ours
            headers.pop("Tracestate", None)
            headers.update(tracing.carried(upstream))
            return slot
        return traced

    def _end_upstream(self, trace: _Trace, error: BaseException | str | None) -> None:
        upstream, trace.upstream = trace.upstream, None
        if upstream is None:
            return
        if error is not None:
            self._failed(upstream, error)
        upstream.end()

    @staticmethod
    def _failed(span: Any, error: BaseException | str) -> None:
        tracing.record_error(span, error)

    @staticmethod
    def _tokens(span: Any, tokens: Tokens | None) -> None:
        for name, value in _counts(tokens).items():
            span.set_attribute(name, value)


def _counts(tokens: Tokens | None) -> dict[str, int]:
    if tokens is None:
        return {}
    return {"gen_ai.usage.input_tokens": tokens.prompt,
            "gen_ai.usage.output_tokens": tokens.completion}
