"""The bounds of a catalog: how large, how deep and how many, and error messages of bounded size.

Every value a catalog can hold has a documented maximum here, so a catalog can never make the
control leader plan, store or print without limit. ``load_yaml`` reads the text with these
bounds (size, nesting, alias expansion) before anything is built from it; the catalog's
validation (catalog/parse.py) and the typed entry (api/catalog.py) check each field against
the rest: this module is the one home of every catalog ``MAX_*``. Pure: no I/O.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any

import yaml

from ..coop import checkpoint, sliced
from ..errors import CatalogError

# -- the document ----------------------------------------------------------------------------
MAX_CATALOG_BYTES = 4 * 1024 * 1024     # the catalog's text, UTF-8
MAX_DEPTH = 16                          # levels of nesting, values included (a catalog needs 5)
# Nodes plus scalar characters once every alias is expanded: a document without aliases stays
# under its own size, so this refuses only aliases that multiply ("billion laughs").
MAX_EXPANDED = 2 * MAX_CATALOG_BYTES
MAX_MODELS = 2000                       # entries in models

# -- one model -------------------------------------------------------------------------------
MAX_NAME_CHARS = 200
MAX_ALIASES = 16                        # other names of one model
MAX_FALLBACKS = 8                       # models one model's requests may fall back to
MAX_SOURCE_CHARS = 2048
MAX_CLASS_CHARS = 64
MAX_REPLICAS = 256
MAX_GPUS = 16                           # devices per node
MAX_NODES = 64                          # nodes of one replica
MAX_TP = MAX_PP = MAX_GPUS * MAX_NODES  # tp x pp must equal gpus x nodes anyway
MAX_MEMORY_GB = 16384.0
MAX_IDLE_STOP_AFTER_S = 365 * 86400.0
MAX_SIZE_BYTES = 1 << 50                # 1 PiB
MAX_ARGS = 64
MAX_ARG_CHARS = 1024
# Admission (the routes table carries these fields: api/router.py)
MAX_SLOTS_PER_REPLICA = 4096            # requests one replica serves at once
MAX_QUEUE_PER_MODEL = 100_000           # requests waiting per model in one router
MAX_WAIT_S = 3600.0                     # how long a request may wait for a slot
MAX_AUTOSCALE_WINDOW_S = 86400.0        # autoscale's up_after_s, down_after_s, cooldown_s
MAX_TOKENS_CAP = 10_000_000             # a model's max_tokens default and max
MAX_DRAIN_TIMEOUT_S = 86400.0           # how long a stopping replica may finish its requests

# -- error messages --------------------------------------------------------------------------
MAX_PROBLEMS_LISTED = 50                # then "... and K more problems"
MAX_PROBLEM_CHARS = 400                 # one problem's text, cut with "..."

_repr = reprlib.Repr()
_repr.maxlevel = 2
_repr.maxstring = _repr.maxother = 60
_repr.maxlong = 40
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 4


def brief(value: Any) -> str:
    """``repr(value)`` cut short (a few items, a few dozen characters, two levels deep): safe
    to put in an error message whatever the catalog holds."""
    return _repr.repr(value)


def brief_text(value: Any) -> str:
    """A short printable string as it is (a field name, a model name), anything else as
    :func:`brief` writes it."""
    if isinstance(value, str) and len(value) <= 80 and value.isprintable():
        return value
    return brief(value)


def cap_problems(problems: list[str]) -> list[str]:
    """At most MAX_PROBLEMS_LISTED problems, each at most MAX_PROBLEM_CHARS long, then a line
    saying how many more there are."""
    out = [p if len(p) <= MAX_PROBLEM_CHARS else p[: MAX_PROBLEM_CHARS - 3] + "..."
           for p in problems[:MAX_PROBLEMS_LISTED]]
    more = len(problems) - len(out)
    if more > 0:
        out.append(f"... and {more} more problem{'s' if more > 1 else ''} "
                   f"(only the first {MAX_PROBLEMS_LISTED} are listed)")
    return out


def _refuse(message: str, fix: str) -> CatalogError:
    return CatalogError(f"{message}; nothing was applied", details=[fix])


def check_size(text: str) -> None:
    """CatalogError when the text is over MAX_CATALOG_BYTES."""
    if len(text) <= MAX_CATALOG_BYTES // 4:     # four bytes at most per character
        return
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_CATALOG_BYTES:
        raise _refuse(f"the catalog is {size} bytes, over the maximum of {MAX_CATALOG_BYTES} "
                      "bytes (MAX_CATALOG_BYTES)",
                      f"a catalog of {MAX_MODELS} models fits well under it; remove what "
                      "is not a model entry (long comments, repeated args)")


def _too_deep(where: str) -> CatalogError:
    return _refuse(f"the catalog nests deeper than {MAX_DEPTH} levels (MAX_DEPTH){where}",
                   "a catalog needs five: the document, models, an entry, its profile or "
                   "args, a value; write the entries out flat")


def _line(event: Any) -> str:
    mark = getattr(event, "start_mark", None)
    return f" (line {mark.line + 1})" if mark is not None else ""


def check_structure(text: str, loader: type) -> None:
    """Walk the YAML events (no recursion, nothing built) and refuse, with CatalogError, a
    document nested deeper than MAX_DEPTH or whose aliases expand past MAX_EXPANDED, counting
    what each alias stands for in full. An alias inside the node it names is refused too."""
    stack: list[list[Any]] = []          # open collections: [size, height, anchor]
    anchors: dict[str, tuple[int, int]] = {}
    total = 0

    def add(size: int, height: int, anchor: str | None, event: Any) -> None:
        nonlocal total
        if anchor is not None:
            anchors[anchor] = (size, height)
        if len(stack) + height > MAX_DEPTH:
            raise _too_deep(_line(event))
        if stack:
            stack[-1][0] += size
            stack[-1][1] = max(stack[-1][1], height)
            grown = stack[0][0]
        else:
            total += size
            grown = total
        if grown > MAX_EXPANDED:
            raise _refuse(f"the catalog's YAML aliases expand to more than {MAX_EXPANDED} "
                          f"nodes and characters (MAX_EXPANDED){_line(event)}",
                          "aliases that repeat other aliases multiply; write the entries "
                          "out, or use an anchor for a small shared part such as a profile")

    for event in sliced(yaml.parse(text, Loader=loader)):
        if isinstance(event, yaml.ScalarEvent):
            add(1 + len(event.value), 1, event.anchor, event)
        elif isinstance(event, yaml.AliasEvent):
            if any(frame[2] == event.anchor for frame in stack):
                raise _refuse(f"the catalog's alias *{brief(event.anchor)} refers to the node "
                              f"that holds it{_line(event)}",
                              "a catalog cannot contain itself; remove the alias")
            size, height = anchors.get(event.anchor or "", (1, 1))
            add(size, height, None, event)
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(stack) >= MAX_DEPTH:
                raise _too_deep(_line(event))
            stack.append([1, 0, event.anchor])
        elif isinstance(event, yaml.CollectionEndEvent):
            size, height, anchor = stack.pop()
            add(size, height + 1, anchor, event)


_BASE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE_LOADER):  # type: ignore[misc,valid-type]
    """The safe loader, giving a gevent worker's event loop its turn while it builds a
    large catalog (llmgw_runtime/coop.py)."""

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        checkpoint()
        return super().construct_object(node, deep)


_LOADER: type = _Loader


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def load_json(text: str) -> Any:
    """The document of a catalog written as JSON (what API clients send, and ``ctl apply``:
    llmgw_runtime/cli/ctl.py), read with the standard library's JSON decoder within the
    bounds above (size, nesting; JSON has no aliases), or ``NOT_JSON`` when the text is not
    a JSON object or array (YAML: :func:`load_yaml` reads it). Read as JSON reads it, its
    numbers included (``1e3`` is a number; YAML 1.1 reads it as a string). At 1,000 models
    this is 2-3 ms where the YAML reader takes 0.2-0.3 s of the control service's CPU."""
    start = text.lstrip()[:1]
    if start not in ("{", "["):
        return NOT_JSON
    check_size(text)
    try:
        doc = json.loads(text, parse_constant=_not_json)   # NaN, Infinity: not JSON
    except RecursionError:
        raise _too_deep("") from None
    except ValueError:          # not JSON (a YAML flow mapping, a comment, NaN...)
        return NOT_JSON
    if _height(doc) > MAX_DEPTH:
        raise _too_deep("")
    return doc


NOT_JSON = object()


def _height(doc: Any) -> int:
    """How deep ``doc`` nests, counted as check_structure counts YAML (a value is one
    level, a collection one more than its deepest value), without recursion; stops
    counting past MAX_DEPTH."""
    height, stack = 1, [(doc, 1)]
    while stack:
        value, level = stack.pop()
        height = max(height, level)
        if height > MAX_DEPTH:
            break
        items = value.values() if isinstance(value, dict) else value \
            if isinstance(value, list) else ()
        stack.extend((item, level + 1) for item in items)
    return height


def load_yaml(text: str) -> Any:
    """The catalog document, read within the bounds above; CatalogError naming the line when
    the text is not YAML, or the bound it passes. JSON is read by :func:`load_json`."""
    doc = load_json(text)
    if doc is not NOT_JSON:
        return doc
    check_size(text)
    try:
        check_structure(text, _LOADER)
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        if "nesting depth" in str(problem):     # libyaml's own limit, met while reading ahead
            raise _too_deep(where) from None
        raise CatalogError(f"the catalog is not valid YAML{where}: {str(problem)[:200]}; "
                           "nothing was applied") from None
    except ValueError as exc:   # e.g. an integer longer than Python converts
        raise CatalogError(f"the catalog holds a value that cannot be read: "
                           f"{str(exc)[:200]}; nothing was applied") from None


def wire(text: str) -> tuple[bytes, str]:
    """A catalog's text as a client sends it (``ctl apply``, ``llmgw up``): JSON when it
    reads as plain data within the bounds (the control service then reads it with
    :func:`load_json`, a hundredth of the YAML reader's CPU at 1,000 models), else the text
    as written, for the control service to read and, when it cannot, to say why with the
    line (a YAML error, a bound, a date or ``.inf`` JSON cannot hold). With its content
    type. YAML whose aliases expand past the size bound as JSON is sent as written too."""
    try:
        doc = load_yaml(text)
        body = json.dumps(doc, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode()    # a lone surrogate: ValueError
    except (CatalogError, TypeError, ValueError):
        body = b""
    if not body or len(body) > MAX_CATALOG_BYTES:
        return text.encode(), "application/yaml"
    return body, "application/json"


def whole(problems: list[str], where: str, value: Any, low: int, high: int | None,
          bound: str | None) -> int:
    """``value`` as a whole number from ``low`` to ``high`` (``bound``: the MAX_* that
    says so), or the nearest end of that range with a problem added."""
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{where} must be a whole number, not {brief(value)}")
        return low
    if value < low:
        problems.append(f"{where} must be at least {low}, not {brief(value)}")
    elif high is not None and value > high:
        problems.append(f"{where} must be at most {high} (llmgw's {bound}), "
                        f"not {brief(value)}")
        return high
    return value


def unknown_fields(problems: list[str], who: str, where: str, raw: dict[Any, Any],
                   known: tuple[str, ...]) -> None:
    """A problem for each key of ``raw`` not in ``known``; ``where`` prefixes the key
    (``profile.``, ``autoscale.``, or nothing for a model's own fields)."""
    for key in raw:
        if key not in known:
            problems.append(f"{who}: {where}{brief_text(key)} is not a known field; known: "
                            f"{', '.join(known)}")
