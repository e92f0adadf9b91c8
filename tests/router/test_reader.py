"""An engine's answer as the relay's Reader reads it (httptools), in both builds of the
relay: the compiled one (when built) and the interpreted one, which must agree."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from llmgw_runtime.router.http.client import request

WIRE = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nTrailer: x\r\n\r\n")


def _builds() -> list[ModuleType]:
    found = [importlib.import_module("llmgw_runtime.router.http._relay")]
    try:
        found.append(importlib.import_module("llmgw_runtime.router.http._crelay"))
    except ImportError:
        pass
    return found


@pytest.fixture(params=_builds(), ids=lambda m: m.__name__.rpartition(".")[2])
def impl(request: pytest.FixtureRequest) -> ModuleType:
    return request.param  # type: ignore[no-any-return]


def _read(impl: ModuleType, wire: bytes, step: int) -> tuple[object, bytes]:
    reader = impl.Reader()
    out = bytearray()
    for at in range(0, len(wire), step):
        reader.feed(wire[at:at + step])
        out += reader.take()
        if reader.error is not None:
            raise reader.error
    return reader, bytes(out)


@pytest.mark.parametrize("step", [1, 2, 5, 7, len(WIRE)])
def test_a_chunked_body_decodes_the_same_however_its_bytes_arrive(impl: ModuleType,
                                                                  step: int) -> None:
    reader, body = _read(impl, WIRE, step)
    assert body == b"hello, world"
    assert reader.done and reader.keep and not reader.extra


def test_bytes_after_the_answer_mark_its_connection_not_to_be_reused(impl: ModuleType) -> None:
    reader, body = _read(impl, WIRE + b"NEXT", len(WIRE) + 4)
    assert body == b"hello, world" and reader.done and reader.extra


def test_a_body_without_length_or_chunks_ends_only_at_the_close(impl: ModuleType) -> None:
    reader, body = _read(impl, b"HTTP/1.1 200 OK\r\nContent-Type: a\r\n\r\npart", 100)
    assert body == b"part" and not reader.done
    assert reader.at_close() and reader.done
    chunked, _ = _read(impl, WIRE[:60], 100)
    assert not chunked.at_close()         # a close inside chunks is no end


def test_interim_answers_are_skipped_and_a_101_is_refused(impl: ModuleType) -> None:
    reader, body = _read(impl, b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early\r\nLink: x"
                         b"\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", 7)
    assert (reader.status, reader.headers, body) == (201, [("Content-Length", "2")], b"ok")
    with pytest.raises(impl.Malformed, match="101"):
        _read(impl, b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
              b"Connection: upgrade\r\n\r\n", 100)


def test_repeated_header_fields_are_joined_and_kept_as_sent(impl: ModuleType) -> None:
    reader, _ = _read(impl, b"HTTP/1.1 204 No Content\r\nVary: a\r\nVARY: b\r\n\r\n", 100)
    assert reader.status == 204 and reader.done
    assert reader.headers == [("Vary", "a"), ("VARY", "b")]
    assert reader.fields["vary"] == "a, b"


@pytest.mark.parametrize(("wire", "why"), [
    (b"HTTP/1.1 2045 Nope\r\n\r\n", "status"),
    (b"HTTX/1.1 200 OK\r\n\r\n", "malformed"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: \xc2\xb2\r\n\r\n", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
     "Transfer-Encoding"),
    (b"HTTP/1.1 200 OK\r\nX: a\x01b\r\n\r\n", "header value"),
    (b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", "header"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXX", "chunk"),
])
def test_a_malformed_answer_is_refused_with_llhttps_reason(impl: ModuleType, wire: bytes,
                                                           why: str) -> None:
    with pytest.raises(impl.Malformed, match=why):
        _read(impl, wire, 3)


def test_the_head_is_held_to_64_kib_exactly_and_to_100_fields(impl: ModuleType) -> None:
    def head(size: int) -> bytes:
        start = b"HTTP/1.1 200 OK\r\nX-Pad: "
        end = b"\r\nContent-Length: 0\r\n\r\n"
        return start + b"a" * (size - len(start) - len(end)) + end
    for step in (1000, 200_000):
        reader, _ = _read(impl, head(65536), step)
        assert reader.done
        with pytest.raises(impl.Malformed, match="over 65536 bytes"):
            _read(impl, head(65537), step)
    many = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n"
    with pytest.raises(impl.Malformed, match="more than 100 header fields"):
        _read(impl, many, 5000)


def test_the_request_is_one_post_with_its_length() -> None:
    assert request("/v1/embeddings", "engine:8080", {"X-A": "1"}, b"{}") == (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: engine:8080\r\nContent-Length: 2\r\n"
        b"X-A: 1\r\n\r\n{}")
    with pytest.raises(ValueError, match="line break"):
        request("/v1/x", "e", {"X-A": "1\r\nEvil: 1"}, b"")
