"""Bounded JSON parsing: depth without recursion, strict UTF-8, finite numbers only."""

from __future__ import annotations

import json
import time

import pytest

from llmgw_runtime.api.jsonlimits import JsonTooDeep, check_depth, loads_bounded


def _nested(depth: int, opener: str = "[", closer: str = "]") -> bytes:
    return (opener * depth + "1" + closer * depth).encode()


@pytest.mark.parametrize(("opener", "closer"), [("[", "]"), ('{"k":', "}"), ('[{"k":', "}]")])
def test_depth_at_the_limit_passes_and_one_more_is_refused(opener: str, closer: str) -> None:
    per_level = 2 if opener.startswith("[{") else 1
    ok = _nested(64 // per_level, opener, closer)
    check_depth(ok, 64)
    assert loads_bounded(ok) is not None
    with pytest.raises(JsonTooDeep, match="64"):
        check_depth(_nested(64 // per_level + 1, opener, closer), 64)


def test_brackets_inside_strings_and_escapes_do_not_count() -> None:
    text = '{"a": "' + "[" * 500 + '", "b": "\\"[[[[\\\\", "c": ["]]]]]"]}'
    check_depth(text.encode(), 3)
    assert loads_bounded(text.encode(), max_depth=3)["c"] == ["]]]]]"]
    # a closing bracket inside a string must not hide real depth either
    hidden = '["' + "]" * 100 + '", ' + "[" * 10 + "]" * 10 + "]"
    with pytest.raises(JsonTooDeep):
        check_depth(hidden.encode(), 5)


def test_escaped_backslash_before_a_quote_ends_the_string() -> None:
    doc = '["a\\\\", ' + "[" * 10 + "]" * 10 + "]"     # ["a\\", [[[...]]]]
    assert json.loads(doc)
    with pytest.raises(JsonTooDeep):
        check_depth(doc.encode(), 5)


def test_unterminated_string_and_unbalanced_input_are_left_to_the_parser() -> None:
    check_depth(b'["' + b"[" * 1000, 8)      # the parser stops at the open string
    with pytest.raises(ValueError):
        loads_bounded(b'["' + b"[" * 1000, max_depth=8)
    with pytest.raises(JsonTooDeep):
        check_depth(b"[" * 1000 + b'"', 8)   # the parser reaches these brackets
    with pytest.raises(ValueError):
        loads_bounded(b"]]]]" + b"[" * 10_000)


def test_very_deep_input_is_refused_without_recursion_error() -> None:
    with pytest.raises(JsonTooDeep):
        loads_bounded(b"[" * 1_000_000 + b"]" * 1_000_000)


@pytest.mark.parametrize("raw", [b"NaN", b"[Infinity]", b'{"t": -Infinity}', b"1e999",
                                 b"[-1.5e400]"])
def test_non_finite_numbers_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match="finite"):
        loads_bounded(raw)


def test_integers_longer_than_the_digit_limit_are_refused_with_the_limit() -> None:
    assert loads_bounded(b"9" * 4300) == int("9" * 4300)
    with pytest.raises(ValueError, match="4300 digits"):
        loads_bounded(b"-" + b"9" * 4301)


@pytest.mark.parametrize("raw", [b'{"a": "\xff"}', '{"a": 1}'.encode("utf-16"),
                                 b'{"a": "\xed\xa0\x80"}'])
def test_bytes_that_are_not_utf8_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        loads_bounded(raw)


def test_ordinary_documents_parse_as_json_loads_does() -> None:
    doc = {"model": "m", "messages": [{"role": "user", "content": "h\u00e9 [ { \" \\"}],
           "n": 3, "t": 0.5, "x": None, "ok": True}
    raw = json.dumps(doc).encode()
    assert loads_bounded(raw) == doc
    assert loads_bounded(json.dumps(doc, ensure_ascii=False).encode()) == doc


def test_a_16_mib_pathological_body_is_checked_in_bounded_time() -> None:
    started = time.process_time()
    check_depth(b"[" + b"{},[]," * (16 * 1024 * 1024 // 6) + b"1]", 64)
    assert time.process_time() - started < 10
