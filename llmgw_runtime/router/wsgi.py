"""The proxied routes (``POST /v1/chat/completions``, ``/v1/completions``,
``/v1/embeddings``, and passed through as they are: ``/v1/responses``, ``/v1/messages``) as
plain WSGI, in front of the Flask app that serves everything else.

These three carry nearly all of a router's traffic, and Flask's request and response
objects, URL matching and hooks cost a tenth of the router's CPU per request on them
(measured with py-spy under ``../shared/bench-proxy``); what the route does needs none of
it: read the body within the limit, parse it strictly, check the key, resolve the model,
admit, forward. Errors are answered in the same OpenAI shape as the Flask routes'
(:func:`error_answer`), with the same metrics; a method other than POST gets the same 405
(with ``Allow``) Flask gave.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from ..api.jsonlimits import JsonTooDeep, loads_bounded
from ..api.usage import NO_KEY
from ..throttle import retry_after
from .body import _too_large, content_length, read_body
from .engine_errors import translate
from .errors import (
    InvalidJson,
    InvalidRequest,
    KeyRateLimited,
    ModelAtCapacity,
    ModelFailing,
    ModelNotFound,
    ModelParked,
    ModelStopped,
    ModelUnplaceable,
    PathNotServed,
    RouterError,
    TooManyFailedKeys,
    UpstreamError,
    error_body,
)
from .max_tokens import capped
from .metrics import _MODEL as METRICS_MODEL
from .metrics import (
    PASSTHROUGH_PATHS,
    PROXIED_PATHS,
    UNKNOWN_MODEL,
    RouterMetrics,
    StartResponse,
    WSGIApp,
)
from .proxy import Answered
from .tracing import FAILED, for_router
from .usage import KEY_ID, METER

if TYPE_CHECKING:
    from ..api.router import RouteModel
    from .routes import RoutesTable
    from .state import RouterState

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 64        # arrays and objects in a request body
MAX_MODEL_NAME = 200       # characters of 'model', as catalog names
_ALLOW = "OPTIONS, POST"
_JSON = ("Content-Type", "application/json")
_STATUS_LINES = {s.value: f"{s.value} {s.phrase}" for s in HTTPStatus}
_STATUS_LINES[499] = "499 Client Closed Request"


def status_line(status: int) -> str:
    return _STATUS_LINES.get(status) or f"{status} Unknown"


def retry_after_s(exc: RouterError) -> float | None:
    """The Retry-After an error is answered with, if any."""
    if isinstance(exc, ModelFailing | ModelAtCapacity | TooManyFailedKeys | KeyRateLimited):
        return exc.retry_after_s
    return None


def error_answer(environ: dict[str, Any], exc: RouterError) -> Answered:
    """``exc`` in OpenAI's error shape, its code noted for the metrics."""
    wait = retry_after_s(exc)
    environ[FAILED] = exc      # for the request's span, when traced (tracing.py)
    return _error(environ, exc.status, exc.body(), exc.code,
                  [] if wait is None else [("Retry-After", retry_after(wait))])


def _error(environ: dict[str, Any], status: int, doc: dict[str, Any], code: str,
           headers: list[tuple[str, str]]) -> Answered:
    RouterMetrics.error_answered(environ, code)
    body = json.dumps(doc).encode()
    return Answered(status, [_JSON, ("Content-Length", str(len(body))), *headers], [body])


def _for_model(doc: dict[str, Any], body: bytes, asked: str, model: str,
               entry: RouteModel | None, path: str) -> tuple[dict[str, Any], bytes]:
    """The request ``doc`` (sent as ``body``, naming ``asked``) as it goes to ``model``:
    named by its own name (an alias resolved, a fallback) and held to its max_tokens
    (``max_tokens.py``; raises its 400), and its body, serialised again only when
    something changed (ASCII escapes: lone surrogates survive)."""
    changes: dict[str, Any] = {} if model == asked else {"model": model}
    if entry is not None and entry.max_tokens is not None:
        changes.update(capped(entry.max_tokens, path, doc, model))
    if not changes:
        return doc, body
    changed = {**doc, **changes}
    return changed, json.dumps(changed).encode()


class ProxiedRoutes:
    """The WSGI app: the proxied paths here, every other path to ``other`` (Flask)."""

    def __init__(self, state: RouterState, other: WSGIApp) -> None:
        self._state = state
        self._other = other
        self._tracing = for_router(state)     # None unless LLMGW_OTEL_ENDPOINT (tracing.py)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse
                 ) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path not in PROXIED_PATHS:
            return self._other(environ, start_response)
        if self._tracing is not None:
            return self._tracing.request(environ, start_response, path, self._answer)
        return self._answer(environ, start_response, path)

    def _answer(self, environ: dict[str, Any], start_response: StartResponse, path: str
                ) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD")
        if method == "POST":
            try:
                answer = self._proxy(environ, path)
            except RouterError as exc:
                answer = self._refused(environ, error_answer(environ, exc))
            except OSError as exc:    # the body could not be read: the server answers it
                answer = self._refused(environ, error_answer(environ, InvalidRequest(
                    f"the request body could not be read: {exc}")))
            except Exception as exc:
                log.exception("%s %s failed", method, path)
                answer = self._refused(environ, error_answer(environ, RouterError(
                    "the router failed on this request (its log says why); retry it, and "
                    "tell the operator if it keeps failing")))
                environ[FAILED] = exc
            meter = environ.get(METER)
            if meter is not None:    # its key's tokens settled now, or when its stream ends
                meter.done(answer.body)
        elif method == "OPTIONS":
            answer = Answered(200, [("Allow", _ALLOW), ("Content-Length", "0")], [b""])
        else:
            answer = _error(environ, 405, error_body(
                f"{method} {path}: The method is not allowed for the requested URL.",
                "invalid_request_error", "method_not_allowed"), "method_not_allowed",
                [("Allow", _ALLOW)])
        start_response(status_line(answer.status), answer.headers)
        return answer.body

    def _refused(self, environ: dict[str, Any], answer: Answered) -> Answered:
        """``answer``, the router's own error to the request, booked under its key when
        the key is one of the table's (valid or expired; not ``-``, not an invalid key):
        the key's refusals in the usage reports (api.usage.UsageEntry.refused), under the
        model the metrics named (``(unknown)`` before one was). One dict update; an
        engine's own error answer never comes here."""
        key_id = environ.get(KEY_ID)
        if key_id is not None and key_id != NO_KEY:
            table = self._state.routes.table
            if table is not None and key_id in table.api_key_hashes:
                self._state.usage.refused(key_id,
                                          environ.get(METRICS_MODEL) or UNKNOWN_MODEL)
        return answer

    def _proxy(self, environ: dict[str, Any], path: str) -> Answered:
        state = self._state
        limit = state.config.max_body_bytes
        length = content_length(environ)
        if length is not None and length > limit:     # refused unread, before the key
            raise _too_large(limit, length)
        table = state.current_table()
        state.check_api_key(table, environ)
        body = read_body(environ, limit)
        try:
            doc = loads_bounded(body, max_depth=MAX_JSON_DEPTH)
        except JsonTooDeep as exc:
            raise InvalidRequest(f"{exc} (the router's limit is {MAX_JSON_DEPTH} levels)"
                                 ) from None
        except ValueError as exc:
            raise InvalidJson(f"the request body is not valid JSON ({exc}); send a JSON object "
                              "in UTF-8 with Content-Type: application/json") from None
        if not isinstance(doc, dict):
            raise InvalidRequest("the request body must be a JSON object with a 'model' field, "
                                 f"not {_json_kind(doc)}")
        model = doc.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' is missing or not a string; set it to one of the ids "
                                 "GET /v1/models lists", param="model")
        if len(model) > MAX_MODEL_NAME:
            raise InvalidRequest(f"'model' is {len(model)} characters long; model names have at "
                                 f"most {MAX_MODEL_NAME}: set it to one of the ids GET /v1/models "
                                 "lists", param="model")
        if model not in table.aliases:
            table = state.table_for(model, table)
        asked, model = model, table.canonical(model)
        if not table.may_use(environ[KEY_ID], model):    # outside the key's scope: absent
            state.metrics.model_named(environ, UNKNOWN_MODEL)
            raise ModelNotFound(f"model '{asked}' is not in the catalog; GET /v1/models lists "
                                "the models this router serves", param="model")
        entry = table.models.get(model)
        state.metrics.model_named(environ, model if entry is not None else UNKNOWN_MODEL)
        # The body goes as the client sent it, unless it names an alias (the engine serves
        # the model under its own name) or the model has a max_tokens: attribute reads.
        sent, sent_body = doc, body
        if model != asked or (entry is not None and entry.max_tokens is not None):
            sent, sent_body = _for_model(doc, body, asked, model, entry, path)
        state.meter(environ, table, sent, len(sent_body))    # the key's limits; its usage
        try:
            route = state.resolve(model, table)
            return _served(state.forward(environ, model, route, path, sent_body, sent, table),
                           path, model, route.engine)
        except (ModelParked, ModelUnplaceable, ModelStopped, ModelAtCapacity) as exc:
            served = self._fall_back(environ, model, exc, path, doc, body, asked, table)
            if served is None:
                raise
            return served

    def _fall_back(self, environ: dict[str, Any], model: str, why: RouterError, path: str,
                   doc: dict[str, Any], body: bytes, asked: str, table: RoutesTable
                   ) -> Answered | None:
        """The answer of the first of ``model``'s fallback models that can serve now (ready
        replicas, within the key's scope, a slot or room in its queue, the request within
        its max_tokens), or None. One step: a fallback's own fallbacks are not followed.
        ``doc`` and ``body`` are the request as the client sent it (naming ``asked``)."""
        state = self._state
        route = table.models.get(model)
        reason = why.code.removeprefix("model_")
        for other in route.fallback if route is not None else ():
            fallback = table.models.get(other)
            if fallback is None or not table.may_use(environ[KEY_ID], other) \
                    or not state.balancer.usable(fallback.endpoints):
                continue
            try:
                other_doc, other_body = _for_model(doc, body, asked, other, fallback, path)
            except InvalidRequest:      # above its max_tokens: it cannot serve this one
                continue
            try:
                answer = _served(state.forward(environ, other, fallback, path, other_body,
                                               other_doc, table), path, other, fallback.engine)
            except (ModelAtCapacity, UpstreamError, PathNotServed):
                continue
            state.metrics.child(state.metrics.fallbacks, model, other, reason).inc()
            return answer
        return None


def _served(answer: Answered, path: str, model: str, engine: str | None) -> Answered:
    """``answer``, unless it is an engine's 404 to a passed-through path: the engine does
    not serve that API (an older llama.cpp, a vLLM without it), said in OpenAI's shape;
    a known engine error in a whole answer is said with what to change in llmgw
    (``engine_errors.py``; streamed answers are never looked at)."""
    if answer.status >= 400 and isinstance(answer.body, list):
        answer = _translated(answer, path, model)
    if answer.status != 404 or path not in PASSTHROUGH_PATHS:
        return answer
    said = b"".join(answer.body) if isinstance(answer.body, list) else b""
    close = getattr(answer.body, "close", None)
    if close is not None:
        close()
    detail = said.decode("utf-8", "replace").strip()[:200]
    raise PathNotServed(
        f"the engine serving model '{model}' ({engine or 'unknown engine'}) does not serve "
        f"POST {path}" + (f" (it answered 404: {detail})" if detail else " (it answered 404)")
        + "; use POST /v1/chat/completions, which every engine serves, or ask the operator "
        "for an engine that serves this API")


def _translated(answer: Answered, path: str, model: str) -> Answered:
    """A whole error answer of an engine, a known one said as ``engine_errors`` says it."""
    data = b"".join(answer.body)
    status, said = translate(answer.status, data, model, path)
    if said is data:
        return answer
    headers = [(k, v) for k, v in answer.headers
               if k.lower() not in ("content-length", "content-type")]
    return Answered(status, [*headers, _JSON, ("Content-Length", str(len(said)))], [said])


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool) or value is None:
        return "true, false or null"
    return "a number"
