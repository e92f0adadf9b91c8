"""One small transport to the control service, wrapped by the agent, the router and ctl:
base URL, bearer token, CA file, JSON both ways, bounded answers, and one mapping of errors.

Answers are parsed as strictly as requests are: a client names the message it expects and
gets a typed value, or :class:`TransportError` saying the answer was malformed."""

from __future__ import annotations

import json
import ssl
from typing import Any, TypeVar

import pydantic
import urllib3

from ..errors import LlmgwError
from .parse import decode, problems

M = TypeVar("M", bound=pydantic.BaseModel)
MAX_ANSWER = 64 * 1024 * 1024     # the largest answer read (a routes table of a big fleet)


class TransportError(LlmgwError):
    """The control service could not be reached, or its answer could not be used."""

    status = 502
    reason = "control_unavailable"


class Unreachable(TransportError):
    """No answer at all: the connection failed or timed out."""


class RemoteError(LlmgwError):
    """The control service answered with an error: its status, reason and message."""

    def __init__(self, status: int, reason: str, message: str,
                 details: list[str] | None = None, retry_after: str | None = None) -> None:
        super().__init__(message, details=details)
        self.status = status          # type: ignore[misc]
        self.reason = reason          # type: ignore[misc]
        self.retry_after = retry_after


class Transport:
    """JSON over HTTP(S) to ``base_url`` with ``Authorization: Bearer <token>``. The
    connection pool is made on first use (in the process and, under gevent, the worker
    that uses it)."""

    def __init__(self, base_url: str, token: str, *, ca_file: str | None = None,
                 timeout_s: float = 10.0, connect_timeout_s: float | None = None,
                 ssl_context: ssl.SSLContext | None = None, maxsize: int = 4) -> None:
        self.base = base_url.rstrip("/")
        self.token = token
        self._ca_file = ca_file or None
        self._ssl_context = ssl_context
        self._timeout = urllib3.Timeout(connect=connect_timeout_s or min(timeout_s, 5.0),
                                        read=timeout_s)
        self._maxsize = maxsize
        self._http: urllib3.PoolManager | None = None

    def __repr__(self) -> str:          # never the token
        return f"Transport({self.base!r})"

    def _pool(self) -> urllib3.PoolManager:
        if self._http is None:
            kwargs: dict[str, Any] = {"num_pools": 2, "maxsize": self._maxsize,
                                      "block": False}
            if self._ssl_context is not None:
                kwargs["ssl_context"] = self._ssl_context
            elif self._ca_file:
                kwargs["ca_certs"] = self._ca_file
            self._http = urllib3.PoolManager(**kwargs)
        return self._http

    def request(self, method: str, path: str, body: Any = None, *,
                data: bytes | None = None, content_type: str = "application/json",
                token: str | None = None) -> tuple[int, Any]:
        """Send ``body`` (a message or JSON-able value) or raw ``data``; returns the status
        and the decoded JSON answer (None when empty). Errors raise RemoteError."""
        if isinstance(body, pydantic.BaseModel):
            body = body.model_dump(mode="json", by_alias=True, exclude_unset=True)
        if body is not None:
            data = json.dumps(body, allow_nan=False).encode()
        headers = {"Authorization": f"Bearer {token or self.token}"}
        if data is not None:
            headers["Content-Type"] = content_type
        try:
            resp = self._pool().request(method, self.base + path, body=data, headers=headers,
                                        timeout=self._timeout, retries=False, redirect=False,
                                        preload_content=False)
            raw = resp.read(MAX_ANSWER + 1)
            resp.release_conn()
        except urllib3.exceptions.HTTPError as exc:
            raise Unreachable(f"the control service at {self.base} is unreachable: "
                              f"{_short(exc)}") from None
        if len(raw) > MAX_ANSWER:
            raise TransportError(f"{method} {path}: the answer is over {MAX_ANSWER} bytes")
        try:
            doc = decode(raw, what="answer") if raw else None
        except LlmgwError:
            doc = None
            if resp.status < 400:
                raise TransportError(f"{method} {path}: the control service at {self.base} "
                                     "answered with something that is not JSON; is this "
                                     "the control service's URL?") from None
        if resp.status >= 400:
            raise _remote_error(resp.status, doc, raw, method, path,
                                resp.headers.get("Retry-After"))
        return resp.status, doc

    def call(self, method: str, path: str, body: Any = None, *, answer: type[M],
             **kwargs: Any) -> M:
        """Like :meth:`request`, the answer parsed as ``answer``."""
        _, doc = self.request(method, path, body, **kwargs)
        try:
            return answer.model_validate(doc)
        except pydantic.ValidationError as exc:
            raise TransportError(f"{method} {path}: the control service's answer is "
                                 "malformed; is it the same llmgw version?",
                                 details=problems(exc)) from None


def _short(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc)[:300]


def _remote_error(status: int, doc: Any, raw: bytes, method: str, path: str,
                  retry_after: str | None) -> RemoteError:
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        details = err.get("details")
        return RemoteError(status, str(err.get("reason") or err.get("code") or "error"),
                           err["message"][:2000],
                           [str(d)[:500] for d in details[:50]]
                           if isinstance(details, list) else [], retry_after)
    text = raw[:200].decode("utf-8", errors="replace").strip()
    return RemoteError(status, "http_error",
                       f"{method} {path}: HTTP {status}" + (f": {text}" if text else ""),
                       [], retry_after)
