"""Reading a request body within the router's limit (``LLMGW_MAX_BODY_MB``)."""

from __future__ import annotations

from typing import Any

from .errors import RequestTooLarge

# In the WSGI environ once the whole request body is read: serve.py's gunicorn hook closes
# the connection of a request answered without it (a 413, a 401...) instead of letting
# gunicorn read the unread rest, however large, to reach the next request.
BODY_READ = "llmgw.body_read"
_READ_BLOCK = 1 << 16


def _too_large(limit: int, size: int | None = None) -> RequestTooLarge:
    what = f"is {size} bytes, above" if size is not None and size > limit else "exceeds"
    return RequestTooLarge(f"the request body {what} this router's limit of {limit} bytes "
                           f"({limit / 1048576:g} MiB, the setting LLMGW_MAX_BODY_MB): send a "
                           "smaller request, or have the operator raise LLMGW_MAX_BODY_MB")


def content_length(environ: dict[str, Any]) -> int | None:
    """The request's Content-Length, or None when absent or not a whole number >= 0 (as
    werkzeug reads it)."""
    value = environ.get("CONTENT_LENGTH")
    if not value:
        return None
    try:
        length = int(value)
    except ValueError:
        return None
    return length if length >= 0 else None


def read_body(environ: dict[str, Any], limit: int) -> bytes:
    """The request body, never holding more than ``limit`` + 64 KiB of it: a Content-Length
    above the limit is refused unread, a body without one (chunked) is read up to one byte
    past the limit and refused there."""
    length = content_length(environ)
    if length is not None and length > limit:
        raise _too_large(limit, length)
    if length is None and not environ.get("wsgi.input_terminated"):
        environ[BODY_READ] = True   # a server that does not end the input: no body (werkzeug)
        return b""
    stream = environ["wsgi.input"]
    want = limit + 1 if length is None else length
    parts: list[bytes] = []
    got = 0
    while got < want:
        part = stream.read(min(_READ_BLOCK, want - got))
        if not part:
            break
        parts.append(part)
        got += len(part)
    if got > limit:
        raise _too_large(limit)
    environ[BODY_READ] = True
    return b"".join(parts)
