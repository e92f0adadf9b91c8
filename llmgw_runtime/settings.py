"""Helpers for the typed configuration objects of each component.

Each component (control, agent, router, up) has a frozen dataclass built from defaults,
then ``LLMGW_*`` environment variables, then explicit values (CLI flags). Every problem is
collected and reported at once in a :class:`ConfigError`.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from .errors import ConfigError

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(name: str, raw: str, hint: Any) -> Any:
    text = raw.strip()
    if hint in (bool, "bool"):
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"{name}={raw!r} is not a boolean; use true or false")
    if hint in (int, "int"):
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not an integer") from None
    if hint in (float, "float"):
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not a number") from None
    if hint in (Path, "Path"):
        return Path(text)
    if hint in (tuple[str, ...], "tuple[str, ...]"):
        return tuple(p for p in (x.strip() for x in text.split(",")) if p)
    return text


def component(cls: type) -> str:
    """Whose settings ``cls`` holds, as a message names it: ``AgentConfig`` -> ``agent``,
    ``ControlConfig`` -> ``control service`` (never the class's name)."""
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", re.sub(r"Config$", "", cls.__name__)).lower()
    return {"control": "control service", "": "llmgw"}.get(words, words)


def load(cls: type[T], *, env: Mapping[str, str] | None = None, prefix: str = "LLMGW_",
         **explicit: Any) -> T:
    """Build ``cls`` (a dataclass) from its defaults, ``LLMGW_<FIELD>`` variables and
    ``explicit`` values (``None`` means "not given"). Raises ConfigError listing every
    bad value; ``cls.validate()`` (if defined) returns more problems as strings."""
    env = os.environ if env is None else env
    hints = get_type_hints(cls)
    values: dict[str, Any] = {}
    problems: list[str] = []
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = prefix + field.name.upper()
        if explicit.get(field.name) is not None:
            values[field.name] = explicit[field.name]
        elif key in env and env[key] != "":
            try:
                values[field.name] = _convert(key, env[key], hints[field.name])
            except ValueError as exc:
                problems.append(str(exc))
    unknown = set(explicit) - {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    if unknown:
        problems.append(f"unknown settings: {', '.join(sorted(unknown))}")
    bad = f"the {component(cls)}'s settings are not valid"
    if problems:
        raise ConfigError(bad, details=problems)
    try:
        obj = cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{bad}: {exc}") from None
    validate = getattr(obj, "validate", None)
    if validate is not None:
        more = list(validate())
        if more:
            raise ConfigError(bad, details=more)
    return obj
