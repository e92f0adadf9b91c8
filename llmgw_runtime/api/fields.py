"""The bounded field types every message is built from.

Strict: a string is a string (no numbers coerced), an integer is an integer within range,
a number is finite, a list has a maximum length, text is printable. The bounds are the
documented limits of docs/security.md ("Bounds")."""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictStr

from ..catalog.bounds import MAX_NAME_CHARS

MAX_NAME = MAX_NAME_CHARS  # node, model and key names: a catalog name's bound
MAX_ID = 80               # replica and part ids
MAX_TEXT = 4096           # error messages, problems, hints
MAX_SHORT = 1024          # addresses, versions, classes, paths, process names
MAX_LIST = 4096           # items of any list in a message
MAX_DEVICES = 1024        # devices of one node
MAX_INT = 2**53           # JSON's exact integers
MAX_PORT = 65535

# Names the operator types and reads back in tables: no spaces, no control characters.
NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._:@+/-]*$"
NODE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
ID_RE = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _printable(value: str) -> str:
    """Text may hold newlines and tabs (engine logs), never other control characters."""
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters (escape sequences, NUL, ...)")
    return value


def _printable_line(value: str) -> str:
    if _CONTROL_LINE.search(value):
        raise ValueError("must be one line of printable characters")
    return value


def clean(value: Any, limit: int = MAX_TEXT) -> Any:
    """``value`` (decoded JSON) with every string made printable and at most ``limit``
    characters: what a sender applies to text it did not write itself (engine logs,
    driver messages), so one odd byte never makes its whole message refused."""
    if isinstance(value, str):
        text = _CONTROL.sub("?", value)
        return text if len(text) <= limit else text[:limit - 1] + "…"
    if isinstance(value, dict):
        return {k: clean(v, limit) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v, limit) for v in value]
    return value


Name = Annotated[StrictStr, Field(min_length=1, max_length=MAX_NAME, pattern=NAME_RE)]
NodeName = Annotated[StrictStr, Field(min_length=1, max_length=MAX_NAME,
                                      pattern=NODE_NAME_RE)]
Id = Annotated[StrictStr, Field(min_length=1, max_length=MAX_ID, pattern=ID_RE)]
Line = Annotated[StrictStr, Field(max_length=MAX_SHORT), AfterValidator(_printable_line)]
Text = Annotated[StrictStr, Field(max_length=MAX_TEXT), AfterValidator(_printable)]
Token = Annotated[StrictStr, Field(min_length=1, max_length=MAX_SHORT, pattern=r"^[!-~]+$")]
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_INT)]
SmallCount = Annotated[int, Field(strict=True, ge=0, le=1_000_000)]
Port = Annotated[int, Field(strict=True, ge=1, le=MAX_PORT)]
Pid = Annotated[int, Field(strict=True, ge=1, le=2**31 - 1)]
Finite = Annotated[float, Field(allow_inf_nan=False, ge=-1e15, le=1e15)]
NonNegative = Annotated[float, Field(allow_inf_nan=False, ge=0, le=1e15)]
UnixTime = Annotated[float, Field(allow_inf_nan=False, gt=0, le=1e11)]
Bool = StrictBool


class Message(BaseModel):
    """A message between processes: unknown fields are refused (a typo, or a newer peer
    sending what this one cannot check), nothing is coerced, numbers are finite."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True,
                              allow_inf_nan=False, populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        """The message as JSON values: the fields it was given (defaults left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class Answer(Message):
    """An answer read by a client: fields a newer server adds are ignored, the ones this
    client knows are checked as strictly."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True,
                              allow_inf_nan=False, populate_by_name=True)
