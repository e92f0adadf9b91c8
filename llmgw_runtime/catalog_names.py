"""A catalog entry's names for clients: its aliases, its fallback models, and the rule
that ties them to the rest of the fleet (an alias names one model only; a fallback names
a model of the fleet). catalog.py parses entries with these."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .catalog_bounds import MAX_ALIASES, MAX_FALLBACKS, MAX_NAME_CHARS, brief, brief_text

if TYPE_CHECKING:
    from .catalog import ModelSpec

# What a client can put in "model" and the router can route: no spaces, no leading slash.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]*(/[A-Za-z0-9._:@+-]+)*$")


def fallback_of(problems: list[str], who: str, raw: Any, name: Any) -> tuple[str, ...]:
    """An entry's fallback models: names, distinct, not itself (that they are models of
    the catalog is checked with the whole catalog: :func:`fallback_problems`)."""
    if not isinstance(raw, list):
        problems.append(f"{who}: fallback must be a list of model names like [small-chat], "
                        f"not {brief(raw)}")
        return ()
    if len(raw) > MAX_FALLBACKS:
        problems.append(f"{who}: {len(raw)} fallback models, over the maximum of "
                        f"{MAX_FALLBACKS} (llmgw's MAX_FALLBACKS)")
        return ()
    out: list[str] = []
    for other in raw:
        if not isinstance(other, str) or len(other) > MAX_NAME_CHARS \
                or not NAME_RE.match(other):
            problems.append(f"{who}: fallback {brief(other)} is not a model name")
        elif other == name:
            problems.append(f"{who}: fallback {brief(other)} is the model itself; remove it")
        elif other in out:
            problems.append(f"{who}: fallback {brief(other)} is listed twice")
        else:
            out.append(other)
    return tuple(out)


def fallback_problems(specs: Sequence[ModelSpec], others: Iterable[str] = ()) -> list[str]:
    """Fallbacks that name no model of the catalog (nor of ``others``, models the store
    keeps). A model's requests fall back one step only: a fallback's own fallbacks are
    not followed, so no chain can loop."""
    known = {s.name for s in specs} | set(others)
    return [f"model {brief_text(s.name)}: fallback {brief_text(f)} is not a model of the "
            "catalog; name a model it lists" for s in specs for f in s.fallback
            if f not in known]

def aliases_of(problems: list[str], who: str, raw: Any, name: Any) -> tuple[str, ...]:
    """An entry's aliases: routable names, distinct, not its own name."""
    if not isinstance(raw, list):
        problems.append(f"{who}: aliases must be a list of names like [gpt-4o-mini, chat], "
                        f"not {brief(raw)}")
        return ()
    if len(raw) > MAX_ALIASES:
        problems.append(f"{who}: {len(raw)} aliases, over the maximum of {MAX_ALIASES} "
                        "(llmgw's MAX_ALIASES)")
        return ()
    out: list[str] = []
    for alias in raw:
        if not isinstance(alias, str) or len(alias) > MAX_NAME_CHARS \
                or not NAME_RE.match(alias):
            problems.append(f"{who}: alias {brief(alias)} cannot be routed; use letters, "
                            "digits and . _ - : @ + / (no spaces, not starting with / or .)")
        elif alias == name:
            problems.append(f"{who}: alias {brief(alias)} is the model's own name; remove it")
        elif alias in out:
            problems.append(f"{who}: alias {brief(alias)} is listed twice")
        else:
            out.append(alias)
    return tuple(out)


def name_clashes(specs: Sequence[ModelSpec], others: dict[str, tuple[str, ...]] | None = None
                 ) -> list[str]:
    """Every name clients could use twice: a model's alias that is another model's name or
    alias, in ``specs`` or among ``others`` (models that stay in the store: name ->
    aliases). An alias names one model only."""
    owner: dict[str, str] = {}
    problems: list[str] = []
    everyone = [(s.name, s.aliases) for s in specs] + list((others or {}).items())
    for model, _ in everyone:
        owner.setdefault(model, model)
    for model, aliases in everyone:
        for alias in aliases:
            taken = owner.get(alias)
            if taken is not None and taken != model:
                what = "the name of" if taken == alias else "an alias of"
                problems.append(f"model {brief_text(model)}: alias {brief_text(alias)} is "
                                f"already {what} model {brief_text(taken)}; an alias names one "
                                "model only")
            else:
                owner[alias] = model
    return problems
