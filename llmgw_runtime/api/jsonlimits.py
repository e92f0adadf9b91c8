"""Bounded JSON parsing for bodies that cross a trust boundary.

``json.loads`` recurses once per level of nesting, so ``[[[[...]]]]`` a few thousand deep
raises ``RecursionError`` (a 500 with a traceback where a 400 belongs), and it accepts
``NaN``/``Infinity`` and turns ``1e999`` into ``inf``, none of which is JSON. Both the router
and the control service parse untrusted bodies with :func:`loads_bounded`; every refusal is a
``ValueError`` whose message says what is wrong and what the limit is.

The depth check is a linear scan without recursion, each step in C: escape pairs are
dropped, then everything but quotes and brackets, then the strings, and the running depth
of the brackets left is summed with ``itertools.accumulate``. Ordinary bodies are checked
in milliseconds; a pathological 16 MiB one (millions of brackets) in one to two seconds on
one core, about as long as ``json.loads`` itself takes on it.
"""

from __future__ import annotations

import json
import math
import operator
import re
from itertools import accumulate, count
from typing import Any

DEFAULT_MAX_DEPTH = 64
MAX_INT_DIGITS = 4300      # Python's own default limit for int(str)

# Once escapes are gone and only quotes and brackets are left, a string is a quote, the
# brackets it holds, and a quote.
_STRING = re.compile(rb'"[^"]*"')
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')
# Opening brackets become 2, closing ones 0: each step of the depth is (value - 1).
_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_BLOCK = 1 << 16


class JsonTooDeep(ValueError):
    """The document nests arrays and objects deeper than allowed."""


def check_depth(raw: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> None:
    """Raise :class:`JsonTooDeep` (a ``ValueError``) when arrays and objects in ``raw``
    nest deeper than ``max_depth``; ``{"a": [1]}`` is 2 deep. Brackets inside strings do
    not count. Malformed input is not judged here (``json.loads`` refuses it), only
    bounded: wherever the parser would still be reading, the depth counted here is at
    least the parser's."""
    # Escapes only occur in strings; removed pairwise from the left as the parser reads
    # them, a run of backslashes keeps its parity and an escaped quote disappears.
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = unescaped.translate(None, _NOT_STRUCTURE)
    if structure.count(b"[") + structure.count(b"{") <= max_depth:
        return
    # Two quotes in a row close a string and open the next (or hold an empty one): with no
    # bracket between them, dropping both leaves the same brackets inside and outside.
    structure = _STRING.sub(b"", structure.replace(b'""', b""))
    quote = structure.find(b'"')
    if quote >= 0:  # an unterminated string: the parser stops there
        structure = structure[:quote]
    if len(structure) <= max_depth:
        return
    steps = structure.translate(_STEPS)
    depth = 0
    for start in range(0, len(steps), _BLOCK):
        block = steps[start:start + _BLOCK]
        # depth after the k-th bracket of the block: depth + sum(block[:k]) - k
        peak = depth + max(map(operator.sub, accumulate(block), count(1)))
        if peak > max_depth:
            raise JsonTooDeep(f"the JSON nests arrays and objects more than {max_depth} levels "
                              f"deep; the limit is {max_depth}: flatten the document")
        depth += sum(block) - len(block)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; send finite numbers only")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large for a finite double; "
                         "send finite numbers only")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits is too long; "
                         f"the limit is {MAX_INT_DIGITS} digits")
    return int(text)


def loads_bounded(raw: bytes, *, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    """Parse ``raw`` as UTF-8 JSON with the nesting bounded by ``max_depth``.

    Refuses, with a ``ValueError`` naming the problem: bytes that are not UTF-8, nesting
    deeper than ``max_depth`` (:class:`JsonTooDeep`), ``NaN``/``Infinity``/``-Infinity``,
    numbers too large for a finite double, integers longer than Python's digit limit, and
    anything ``json.loads`` refuses."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"the body is not UTF-8 (byte {exc.start} is invalid); "
                         "JSON must be sent as UTF-8") from None
    check_depth(raw, max_depth)
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                          parse_int=_bounded_int)
    except RecursionError:  # only reachable with a max_depth near the interpreter's limit
        raise JsonTooDeep(f"the JSON nests too deep to parse (limit {max_depth})") from None
