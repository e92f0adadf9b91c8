"""A catalog entry's names for clients: its aliases, its fallback models, and the rule
that ties them to the rest of the fleet (an alias names one model only; a fallback names
a model of the fleet). catalog/parse.py parses entries with these."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple, Protocol

from ..api.catalog import MODEL_NAME_RE
from .bounds import MAX_ALIASES, MAX_FALLBACKS, MAX_NAME_CHARS, brief, brief_text


class Named(Protocol):
    """What the fleet-wide rules read of an entry (a ``ModelSpec``, or :class:`Names`)."""

    @property
    def name(self) -> str: ...
    @property
    def aliases(self) -> tuple[str, ...]: ...
    @property
    def fallback(self) -> tuple[str, ...]: ...


class Names(NamedTuple):
    """An entry's names as far as they could be read, also of an entry with other problems:
    the catalog-wide rules (clashes, fallbacks that name no model) check every entry."""

    name: str
    aliases: tuple[str, ...]
    fallback: tuple[str, ...]

# What a client can put in "model" and the router can route: no spaces, no leading slash.
NAME_RE = re.compile(MODEL_NAME_RE)


def _names(problems: list[str], who: str, raw: Any, name: Any, *, field: str, one: str,
           many: str, maximum: tuple[int, str], example: str, unroutable: str,
           itself: str) -> tuple[str, ...]:
    """The list of names in an entry's ``field``: a list, at most ``maximum`` (its value
    and its name), each routable, not the entry's own name, none twice; each problem
    names the item as ``one`` (``many``: several)."""
    if not isinstance(raw, list):
        problems.append(f"{who}: {field} must be a list of {example}, not {brief(raw)}")
        return ()
    if len(raw) > maximum[0]:
        problems.append(f"{who}: {len(raw)} {many}, over the maximum of {maximum[0]} "
                        f"(llmgw's {maximum[1]})")
        return ()
    out: list[str] = []
    for item in raw:
        if not isinstance(item, str) or len(item) > MAX_NAME_CHARS or not NAME_RE.match(item):
            problems.append(f"{who}: {one} {brief(item)} {unroutable}")
        elif item == name:
            problems.append(f"{who}: {one} {brief(item)} is {itself}; remove it")
        elif item in out:
            problems.append(f"{who}: {one} {brief(item)} is listed twice")
        else:
            out.append(item)
    return tuple(out)


def fallback_of(problems: list[str], who: str, raw: Any, name: Any) -> tuple[str, ...]:
    """An entry's fallback models: names, distinct, not itself (that they are models of
    the fleet is checked with the whole fleet: :func:`fallback_problems`)."""
    return _names(problems, who, raw, name, field="fallback", one="fallback",
                  many="fallback models", maximum=(MAX_FALLBACKS, "MAX_FALLBACKS"),
                  example="model names like [small-chat]",
                  unroutable="is not a model name", itself="the model itself")


def aliases_of(problems: list[str], who: str, raw: Any, name: Any) -> tuple[str, ...]:
    """An entry's aliases: routable names, distinct, not its own name."""
    return _names(problems, who, raw, name, field="aliases", one="alias", many="aliases",
                  maximum=(MAX_ALIASES, "MAX_ALIASES"), example="names like [gpt-4o-mini, chat]",
                  unroutable="cannot be routed; use letters, digits and . _ - : @ + / (no "
                  "spaces, not starting with / or .)", itself="the model's own name")


def fallback_problems(specs: Sequence[Named], others: Iterable[str] = ()) -> list[str]:
    """Fallbacks that name no model of the catalog (nor of ``others``, models the store
    keeps). A model's requests fall back one step only: a fallback's own fallbacks are
    not followed, so no chain can loop."""
    known = {s.name for s in specs} | set(others)
    return [f"model {brief_text(s.name)}: fallback {brief_text(f)} is not a model of the "
            "catalog; name a model it lists" for s in specs for f in s.fallback
            if f not in known]


def name_clashes(specs: Sequence[Named], others: dict[str, tuple[str, ...]] | None = None
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
