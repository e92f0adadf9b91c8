"""A model's cap on the tokens one answer may generate (the catalog's ``max_tokens:
{default, max, clamp}``, docs/routing.md "max_tokens"), applied by the router to chat and
text completion requests before they are metered and forwarded.

Pure: the request's decoded body in, the fields to change out (or a refusal). The caller
re-serialises the body only when something changes, so a model without a cap, or a
request within it that says how much it wants, is forwarded byte for byte.
"""

from __future__ import annotations

from typing import Any

from ..api.catalog import MaxTokens
from .errors import InvalidRequest

# The fields that say how much an answer may generate, per path. Chat accepts both (OpenAI
# now prefers max_completion_tokens); when a body sets both, the larger governs.
FIELDS: dict[str, tuple[str, ...]] = {
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/completions": ("max_tokens",),
}


def capped(cap: MaxTokens, path: str, doc: dict[str, Any], model: str) -> dict[str, int]:
    """The fields of ``doc`` to set for ``model``'s cap: ``max_tokens`` = the default
    when the request sets none (null counts as none), each field above the max lowered to
    it when the model clamps; empty when nothing changes (other paths: always). Raises
    InvalidRequest (400, ``param`` the field) when the request asks for more than the max
    and the model does not clamp, or sets a field that is not a number of tokens."""
    fields = FIELDS.get(path)
    if fields is None:
        return {}
    asked: dict[str, int | float] = {}
    for name in fields:
        value = doc.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or (isinstance(value, float) and not value.is_integer()):
            if cap.max is None:     # it set one, and there is nothing to hold it to: the
                return {}           # engine says what it makes of it
            raise InvalidRequest(f"{name} must be a whole number of tokens, not "
                                 f"{_shown(value)}; model '{model}' allows at most "
                                 f"{cap.max}", param=name)
        asked[name] = value
    if not asked:
        return {} if cap.default is None else {"max_tokens": cap.default}
    most = cap.max
    if most is None:
        return {}
    name = max(asked, key=lambda n: asked[n])
    if asked[name] <= most:
        return {}
    if not cap.clamp:
        raise InvalidRequest(
            f"{name} {_shown(asked[name])} is above model '{model}''s cap of {most}; ask for "
            f"at most {most}" + (f", or leave {name} out for the model's default of "
                                 f"{cap.default}" if cap.default is not None and len(asked) == 1 else ""),
            param=name)
    return {n: most for n, value in asked.items() if value > most}


def _shown(value: Any) -> str:
    """A field's value in a message: a whole float as an integer, anything at most 40
    characters."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e18:
        value = int(value)
    text = value if isinstance(value, int) else repr(value)
    return str(text)[:40]
