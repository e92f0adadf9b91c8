"""The HTTP/1.1 pieces the router's upstream client reads (router/http1.py), as pure
functions: how an answer's body ends, and its body decoded however its bytes arrive."""

from __future__ import annotations

import pytest

from llmgw_runtime.router.http1 import (
    CHUNKED,
    CLOSE,
    LENGTH,
    Body,
    Malformed,
    framing,
    parse_head,
    request,
)

WIRE = b"5;x=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n"


def _decode(body: Body, wire: bytes, step: int) -> bytes:
    buf, out = bytearray(), bytearray()
    for at in range(0, len(wire), step):
        buf += wire[at:at + step]
        out += body.take(buf)
    return bytes(out)


@pytest.mark.parametrize("step", [1, 2, 5, 7, len(WIRE)])
def test_a_chunked_body_decodes_the_same_however_its_bytes_arrive(step: int) -> None:
    body = Body(CHUNKED)
    assert _decode(body, WIRE + b"NEXT", step) == b"hello, world"
    assert body.ended                   # and "NEXT" is left for whoever reads on


def test_a_body_that_ends_at_the_close_ends_only_then() -> None:
    body = Body(CLOSE)
    assert body.take(bytearray(b"part")) == b"part" and not body.ended
    assert body.at_close() and body.ended
    assert not Body(CHUNKED).at_close()  # a close inside chunks is no end


def test_a_body_of_length_zero_is_ended_before_any_byte() -> None:
    assert Body(LENGTH, 0).ended and not Body(LENGTH, 3).ended


@pytest.mark.parametrize(("status", "fields", "expected"), [
    (204, {"content-length": "10"}, (LENGTH, 0)),
    (200, {"transfer-encoding": "gzip, chunked"}, (CHUNKED, 0)),
    (200, {"transfer-encoding": "gzip"}, (CLOSE, 0)),
    (200, {"content-length": "5, 5"}, (LENGTH, 5)),
    (200, {}, (CLOSE, 0)),
])
def test_how_an_answer_body_ends(status: int, fields: dict[str, str],
                                 expected: tuple[str, int]) -> None:
    assert framing(status, fields) == expected


def test_repeated_header_fields_are_joined_and_kept_as_sent() -> None:
    status, headers, fields = parse_head(b"HTTP/1.1 200 OK\r\nVary: a\r\nVARY: b")
    assert status == 200
    assert headers == [("Vary", "a"), ("VARY", "b")]
    assert fields["vary"] == "a, b"


def test_a_status_line_without_a_reason_is_read_and_one_with_junk_is_not() -> None:
    assert parse_head(b"HTTP/1.1 204")[0] == 204
    with pytest.raises(Malformed, match="status line"):
        parse_head(b"HTTP/1.1 2045 Nope")


def test_the_request_is_one_post_with_its_length() -> None:
    assert request("/v1/embeddings", "engine:8080", {"X-A": "1"}, b"{}") == (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: engine:8080\r\nContent-Length: 2\r\n"
        b"X-A: 1\r\n\r\n{}")
