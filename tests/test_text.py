"""The terminal sanitiser (``llmgw_runtime/text.py``): every control character and
invisible mark shows as an escape, in a string, a multi-line message or a whole document."""

from __future__ import annotations

import pytest

from llmgw_runtime.text import printable, printable_doc, printable_lines


@pytest.mark.parametrize(("raw", "shown"), [
    ("gpu-01", "gpu-01"),
    ("n\x1b[2J", "n\\x1b[2J"),
    ("a\nb\tc\rd\x00", "a\\x0ab\\x09c\\x0dd\\x00"),
    ("del\x7f c1\x9b31m \x85", "del\\x7f c1\\x9b31m \\x85"),
    ("\u202egnp.exe", "\\u202egnp.exe"),
    ("ünïcødé ✓ 模型", "ünïcødé ✓ 模型"),
])
def test_printable_shows_every_control_character_as_an_escape(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_printable_doc_reaches_every_string_and_lines_keep_their_newlines() -> None:
    doc = {"n\x1b": ["\x1b", 1, None, {"k": ("\x07",)}]}
    assert printable_doc(doc) == {"n\\x1b": ["\\x1b", 1, None, {"k": ("\\x07",)}]}
    assert printable_lines("one\x1b\ntwo") == "one\\x1b\ntwo"
