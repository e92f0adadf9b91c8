"""One strict parser for every message: JSON bytes (bounded depth, finite numbers) in, a
typed value out, or a :class:`~llmgw_runtime.errors.ValidationError` that lists every
problem at once, each naming the field ("devices[3].memory_used_mb: ...")."""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic

from ..errors import ValidationError
from .fields import ID_RE, NAME_RE, NODE_NAME_RE
from .jsonlimits import check_depth, loads_bounded

M = TypeVar("M", bound=pydantic.BaseModel)

MAX_DEPTH = 32            # nesting of any message: the deepest one needs 5
MAX_DETAILS = 20          # problems listed in one error (the rest are counted)
_NAME_HINT = ("must be letters, digits and . _ - (no spaces or control characters, not "
              "starting with a symbol)")
_HINTS = {
    "extra_forbidden": "is not a field of this message; check its spelling",
    "missing": "is required",
    "finite_number": "must be a finite number",
}


class InvalidJSON(ValidationError):
    """The body is not JSON llmgw reads: not UTF-8, malformed, too deep, not finite."""

    reason = "invalid_json"


def where(loc: tuple[int | str, ...]) -> str:
    """``("devices", 3, "memory_used_mb")`` -> ``devices[3].memory_used_mb``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part)[:60]
            out += ("." if out else "") + (text if text.isidentifier() else repr(text))
    return out or "(the body)"


def problems(exc: pydantic.ValidationError) -> list[str]:
    """Every problem of ``exc`` as one bounded line each (at most MAX_DETAILS + 1)."""
    out = []
    errors = exc.errors(include_url=False, include_context=True, include_input=True)
    for err in errors[:MAX_DETAILS]:
        message = _HINTS.get(err["type"]) or err["msg"].removeprefix("Value error, ")
        if err["type"] == "string_pattern_mismatch" and (err.get("ctx") or {}).get(
                "pattern") in (NAME_RE, NODE_NAME_RE, ID_RE):
            message = _NAME_HINT
        got = err.get("input")
        shown = "" if err["type"] in ("missing", "extra_forbidden") or isinstance(
            got, dict | list) else f" (got {repr(got)[:60]})"
        out.append(f"{where(tuple(err['loc']))}: {message[:200]}{shown}")
    if len(errors) > MAX_DETAILS:
        out.append(f"... and {len(errors) - MAX_DETAILS} more problems")
    return out


def parse(cls: type[M], data: Any, *, what: str) -> M:
    """``data`` (already decoded JSON) as a ``cls``, or a 400 naming every bad field."""
    try:
        return cls.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ValidationError(f"the {what} is malformed; nothing of it was used",
                              details=problems(exc)) from None


# Literals the fast path leaves to the slow one, which refuses them with its own words.
# (Numbers past a double's range or Python's digit limit need no such test: every number
# of a message is a bounded field, so pydantic refuses them and the slow path says why.)
_NOT_JSON = (b"NaN", b"Infinity")


def parse_json(cls: type[M], raw: bytes | str, *, what: str) -> M:
    """``raw`` JSON text as a ``cls``: depth and numbers are checked before decoding.

    A body that passes is validated by pydantic straight from the bytes (no Python objects
    in between); one it refuses, or one the checks leave out, is decoded and validated
    again the slow way, so every refusal says what it always said."""
    data = raw.encode() if isinstance(raw, str) else raw
    if data and not any(word in data for word in _NOT_JSON):
        try:
            check_depth(data, MAX_DEPTH)
            return cls.model_validate_json(data)
        except ValueError:             # pydantic's ValidationError too: say it precisely
            pass
    return parse(cls, decode(data, what=what), what=what)


def decode(raw: bytes | str, *, what: str) -> Any:
    """JSON text, refusing deep nesting and NaN/Infinity with a 400."""
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        return loads_bounded(data or b"null", max_depth=MAX_DEPTH)
    except RecursionError:
        raise InvalidJSON(f"the {what} nests deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidJSON(f"the {what} is not valid JSON: {str(exc)[:200]}") from None
