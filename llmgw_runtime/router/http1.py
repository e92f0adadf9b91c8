"""The HTTP/1.1 the router's upstream client writes and reads, as pure functions over bytes
(``router/upstream.py`` keeps the connections): the request, the answer's head, how the
answer's body ends, and the body decoded from its framing as it arrives.

An engine is trusted no further than its answer's shape: a head over :data:`MAX_HEAD`
bytes or :data:`MAX_HEADERS` fields, a malformed status line or header line (a name that
is not a token, a value with control bytes), two lengths, a chunk size that is not 1-16
hex digits, a size or trailer line over :data:`MAX_CHUNK_LINE` bytes, or a chunk that
does not end with CRLF raises :class:`Malformed` with a message saying which.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

MAX_HEAD = 65536          # bytes of an answer's status line and headers
MAX_HEADERS = 100
MAX_CHUNK_LINE = 4096     # a chunk-size line (extensions included), or a trailer line
# A field name, or a method: an RFC 9110 token. A field value: no control bytes but tab.
# (router/worker.py holds requests to the same two rules.)
TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")
_SIZE_LINE = re.compile(rb"([0-9a-fA-F]{1,16})\r\n")

LENGTH, CHUNKED, CLOSE = "length", "chunked", "close"   # how an answer's body ends


class Malformed(Exception):
    """The engine's answer is not HTTP/1.1 as the router reads it."""


def request(path: str, authority: str, headers: Mapping[str, str], body: bytes) -> bytes:
    """A POST of ``body`` with ``headers`` (none may hold a line break: ValueError)."""
    lines = [f"POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {len(body)}\r\n"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"request header {name!r} has a line break")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1") + body


def parse_head(head: bytes) -> tuple[int, list[tuple[str, str]], dict[str, str]]:
    """An answer's head (without its blank line): the status, the header fields as sent,
    and the fields by lower-case name (repeated ones joined with ``, ``)."""
    lines = head.split(b"\r\n")
    status_line = lines[0]
    version, _, rest = status_line.partition(b" ")
    code = rest[:3]
    if (version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit()
            or rest[3:4] not in (b"", b" ")):
        raise Malformed(f"the answer's status line is malformed: {status_line[:60]!r}")
    if len(lines) - 1 > MAX_HEADERS:
        raise Malformed(f"the answer has more than {MAX_HEADERS} header fields")
    headers: list[tuple[str, str]] = []
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not TOKEN.match(name):
            raise Malformed(f"a header field of the answer is malformed: {line[:60]!r}")
        value = value.strip(b" \t")
        if BAD_VALUE.search(value):
            raise Malformed(f"a header value of the answer has control bytes: {line[:60]!r}")
        key = name.decode("latin-1")
        text = value.decode("latin-1")
        headers.append((key, text))
        low = key.lower()
        fields[low] = f"{fields[low]}, {text}" if low in fields else text
    return int(code), headers, fields


def framing(status: int, fields: dict[str, str]) -> tuple[str, int]:
    """How the answer's body ends (RFC 9112 6.3): (LENGTH, n), (CHUNKED, 0) or (CLOSE, 0)."""
    if status in (204, 304) or status < 200:
        return LENGTH, 0
    coding = fields.get("transfer-encoding")
    if coding is not None:
        if coding.strip().lower().rpartition(",")[2].strip() != "chunked":
            return CLOSE, 0
        return CHUNKED, 0
    length = fields.get("content-length")
    if length is None:
        return CLOSE, 0
    values = {v.strip() for v in length.split(",")}
    if len(values) != 1:
        raise Malformed(f"the answer has two different lengths: {length!r}")
    value = values.pop()
    if not value.isdigit() or len(value) > 18:
        raise Malformed(f"the answer's Content-Length is not a number: {value[:20]!r}")
    return LENGTH, int(value)


class Body:
    """An answer's body decoded from its framing as its bytes arrive: :meth:`take` takes
    what it can out of the connection's buffer; ``ended`` says the body is complete (what
    is left in the buffer then is not the body's)."""

    __slots__ = ("mode", "ended", "_left", "_state")

    def __init__(self, mode: str, length: int = 0) -> None:
        self.mode = mode
        self._left = length        # LENGTH: bytes left; CHUNKED: of the current chunk
        self._state = 0            # CHUNKED: 0 size line, 1 data, 2 CRLF, 3 trailers, 4 end
        self.ended = mode == LENGTH and length == 0

    def at_close(self) -> bool:
        """The engine closed the connection: whether that ends the body (CLOSE)."""
        if self.mode == CLOSE:
            self.ended = True
        return self.ended

    def take(self, buf: bytearray) -> bytes:
        """The body bytes in ``buf``, taken out of it."""
        if not buf or self.ended:
            return b""
        if self.mode == CLOSE:
            data = bytes(buf)
            buf.clear()
            return data
        if self.mode == LENGTH:
            n = min(self._left, len(buf))
            data = bytes(buf[:n])
            del buf[:n]
            self._left -= n
            self.ended = not self._left
            return data
        if self._state == 0:
            simple = _SIZE_LINE.match(buf)   # one whole chunk, as engines send a stream
            if simple is not None:
                start = simple.end()
                stop = start + int(simple.group(1), 16)
                if len(buf) == stop + 2 and stop > start and buf.endswith(b"\r\n"):
                    data = bytes(buf[start:stop])
                    buf.clear()
                    return data
        return self._chunks(buf)

    def _chunks(self, buf: bytearray) -> bytes:
        parts: list[bytes] = []
        while buf and not self.ended:
            state = self._state
            if state == 0:                               # a chunk's size line
                simple = _SIZE_LINE.match(buf)           # no extensions: the usual case
                if simple is not None:
                    size, start = int(simple.group(1), 16), simple.end()
                    stop = start + size
                    if size and len(buf) >= stop + 2:    # the whole chunk is here
                        if buf[stop:stop + 2] != b"\r\n":
                            raise Malformed("a chunk of the answer does not end with CRLF")
                        parts.append(bytes(buf[start:stop]))
                        del buf[:stop + 2]
                        continue
                    del buf[:start]
                else:
                    end = buf.find(b"\r\n")
                    if end < 0:
                        if len(buf) > MAX_CHUNK_LINE:
                            raise Malformed("a chunk size line of the answer is too long")
                        break
                    line = bytes(buf[:end])
                    size_text = line.partition(b";")[0].strip(b" \t")
                    if not _SIZE.fullmatch(size_text):
                        raise Malformed("a chunk size of the answer is malformed: "
                                        f"{line[:40]!r}")
                    del buf[:end + 2]
                    size = int(size_text, 16)
                self._left = size
                self._state = 1 if size else 3
            elif state == 1:                             # chunk data
                n = min(self._left, len(buf))
                parts.append(bytes(buf[:n]))
                del buf[:n]
                self._left -= n
                if self._left:
                    break
                self._state = 2
            elif state == 2:                             # the CRLF after chunk data
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise Malformed("a chunk of the answer does not end with CRLF")
                del buf[:2]
                self._state = 0
            else:                                        # trailer fields, then a blank line
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > MAX_CHUNK_LINE:
                        raise Malformed("a trailer line of the answer is too long")
                    break
                del buf[:end + 2]
                if end == 0:
                    self._state = 4
                    self.ended = True
        return parts[0] if len(parts) == 1 else b"".join(parts)
