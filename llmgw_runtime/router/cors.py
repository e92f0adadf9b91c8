"""CORS: which web pages may call the router from a browser (``cors_origins``, env
``LLMGW_CORS_ORIGINS``: a comma list of origins, or ``*``; none by default).

A browser asks first (a preflight ``OPTIONS`` with ``Origin`` and
``Access-Control-Request-Method``) before a ``POST`` with ``Authorization`` or a JSON body.
For an allowed origin the router answers the preflight itself (``204`` with the methods,
the request headers the page may send, ``Authorization``, ``Content-Type`` and ``X-Api-Key``
among them, and how long the browser may keep the answer), and every answer to a request
from that origin carries ``Access-Control-Allow-Origin`` (``Vary: Origin`` unless any
origin is allowed) and exposes ``Retry-After`` and the ``X-Llmgw-*`` fields. Any other
origin gets no CORS field, so its browser refuses the page the answer. An engine's own CORS
fields never reach the client (``proxy.CORS_FIELDS``). The API key is still required as
for any client: CORS only says which pages' scripts may read the answers.

A request without ``Origin`` (every non-browser client) costs one dictionary lookup.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:     # not at run time: the settings load this module in the router's
    # master, which must not import prometheus_client (metrics.py) before its workers
    from .metrics import StartResponse, WSGIApp

ANY = "*"
METHODS = "GET, POST, OPTIONS"
HEADERS = ("Authorization", "Content-Type", "X-Api-Key")
EXPOSED = "Retry-After, X-Llmgw-Model, X-Llmgw-Replica"
MAX_AGE_S = 600
MAX_REQUESTED = 1000            # characters of Access-Control-Request-Headers echoed
_HEADER_LIST = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*$")


def parse_origins(value: str) -> frozenset[str]:
    """The allowed origins of a ``cors_origins`` setting (empty: none); raises ValueError
    naming a malformed one."""
    origins = frozenset(part.strip().rstrip("/") for part in value.split(",") if part.strip())
    if ANY in origins:
        if len(origins) > 1:
            raise ValueError(f"cors_origins {value!r} has '*' beside origins: use '*' alone "
                             "(any origin) or a comma list of origins")
        return origins
    for origin in origins:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path \
                or parts.query or parts.fragment or parts.username is not None:
            raise ValueError(f"cors_origins: {origin!r} is not an origin; write each as "
                             "scheme://host[:port] (e.g. https://app.example.com), comma "
                             "separated, or '*' for any")
    return origins


def allowed(origins: frozenset[str], origin: str) -> bool:
    return ANY in origins or origin in origins


def preflight_headers(origins: frozenset[str], origin: str, requested: str | None
                      ) -> list[tuple[str, str]]:
    """The answer's fields to an allowed origin's preflight: the request headers it asked
    for (well-formed, bounded) beside the ones every client sends."""
    names = list(HEADERS)
    if requested and len(requested) <= MAX_REQUESTED and _HEADER_LIST.match(requested.strip()):
        known = {n.lower() for n in names}
        names += [n for n in (p.strip() for p in requested.split(","))
                  if n.lower() not in known]
    return [*answer_headers(origins, origin),
            ("Access-Control-Allow-Methods", METHODS),
            ("Access-Control-Allow-Headers", ", ".join(names)),
            ("Access-Control-Max-Age", str(MAX_AGE_S)), ("Content-Length", "0")]


def answer_headers(origins: frozenset[str], origin: str) -> list[tuple[str, str]]:
    """The fields every answer to an allowed origin carries."""
    if ANY in origins:
        return [("Access-Control-Allow-Origin", ANY),
                ("Access-Control-Expose-Headers", EXPOSED)]
    return [("Access-Control-Allow-Origin", origin), ("Vary", "Origin"),
            ("Access-Control-Expose-Headers", EXPOSED)]


class Cors:
    """The WSGI middleware: preflights of allowed origins answered here, their other
    answers given the CORS fields; everything else passes untouched."""

    def __init__(self, app: WSGIApp, origins: frozenset[str]) -> None:
        self._app = app
        self._origins = origins

    def __call__(self, environ: dict[str, Any], start_response: StartResponse
                 ) -> Iterable[bytes]:
        origin = environ.get("HTTP_ORIGIN")
        if origin is None or not allowed(self._origins, origin):
            return self._app(environ, start_response)
        if environ.get("REQUEST_METHOD") == "OPTIONS" \
                and "HTTP_ACCESS_CONTROL_REQUEST_METHOD" in environ:
            start_response("204 No Content", preflight_headers(
                self._origins, origin, environ.get("HTTP_ACCESS_CONTROL_REQUEST_HEADERS")))
            return [b""]
        extra = answer_headers(self._origins, origin)

        def with_cors(status: str, headers: list[tuple[str, str]], *exc: Any) -> Any:
            return start_response(status, [*headers, *extra], *exc)
        return self._app(environ, with_cors)
