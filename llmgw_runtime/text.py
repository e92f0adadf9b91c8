"""Text from the fleet made safe for a terminal: the one sanitiser every ``ctl`` table and
line, ``llmgw up``'s log tails and the status screen (``status/render.py``) go through
(JSON output needs none: JSON escapes control characters itself).

Names and messages come from whoever could write them (a node names itself when it joins,
an engine writes its error): a raw ESC could clear the operator's screen, move the cursor
or retitle the window, and a raw newline could forge a line. Every control character (C0
including newline and tab, DEL, C1; so every escape sequence, which starts with ESC or
CSI) and the invisible bidirectional and line-separator marks are replaced with a visible
escape: ``"\\x1b[2J"`` is shown as ``\\x1b[2J``.
"""

from __future__ import annotations

from typing import Any

# Bidirectional overrides and isolates (text that reads other than it is) and the Unicode
# line and paragraph separators.
_INVISIBLE = frozenset([0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F),
                        *range(0x2066, 0x206A)])


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x20 or 0x7F <= code <= 0x9F:
        return f"\\x{code:02x}"
    if code in _INVISIBLE:
        return f"\\u{code:04x}"
    return ch


def printable(text: str) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``, ``\\n``
    as ``\\x0a``); unchanged when there is none (the common case costs one scan)."""
    if text.isprintable():
        return text
    return "".join(_escape(ch) for ch in text)


def printable_lines(text: str) -> str:
    """Like :func:`printable`, but keeps the newlines (a multi-line message)."""
    return "\n".join(printable(line) for line in text.split("\n"))


def printable_doc(value: Any, keep_newlines: bool = False) -> Any:
    """``value`` with :func:`printable` (or, with ``keep_newlines``,
    :func:`printable_lines`) applied to every string in it, keys included (a decoded JSON
    document: dicts, lists, strings, numbers). Keep newlines only where the renderer
    splits or joins lines itself (``status.render``: a last error's last line)."""
    if isinstance(value, str):
        return printable_lines(value) if keep_newlines else printable(value)
    if isinstance(value, dict):
        return {printable_doc(k, keep_newlines): printable_doc(v, keep_newlines)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(printable_doc(v, keep_newlines) for v in value)
    return value
