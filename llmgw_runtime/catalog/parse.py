"""The catalog: parse and validate model entries (a pure function of the text).

The entry itself, every field with its type, default and bounds, is defined once in
api/catalog.py (``ModelSpec``); this module reads the catalog's YAML into it with messages
an operator can act on. Validation reports every problem at once, each naming the model and
the field, and the caller writes nothing when any entry is bad. Every count and length has
a maximum (catalog/bounds.py), the YAML is read within bounds of size, nesting and alias
expansion, and an error lists at most a bounded number of problems of bounded length. Args
that set a flag the agent owns (engines/owned.py) and sources whose downloaded name would
not be one safe file name in the weights directory (weights/sources.py) are refused here,
at apply time. A field with no rule of its own here (a number, a choice, a flag, a mapping
of those) is checked by :func:`plain` from its definition alone.
"""

from __future__ import annotations

import json
import math
import re
import typing
from typing import Any, Literal

import pydantic

from ..api.catalog import (
    CLASS_RE as CLASS_PATTERN,
)
from ..api.catalog import (
    MODEL_FIELDS,
    Frozen,
    ModelSpec,
    Profile,
    bounds,
    catalog_names,
    default,
    extra,
    is_mig_class,
)
from ..api.catalog import (
    SHA256_RE as SHA256_PATTERN,
)
from ..coop import sliced
from ..engines.drivers import args_problem
from ..engines.owned import owned_flags_in, owned_flags_message
from ..engines.slots import SLOT_FLAGS, slots_from_args
from ..errors import CatalogError, EngineError
from ..weights.sources import parse_source
from .bounds import (
    MAX_ARG_CHARS,
    MAX_ARGS,
    MAX_CLASS_CHARS,
    MAX_IDLE_STOP_AFTER_S,
    MAX_MEMORY_GB,
    MAX_MODELS,
    MAX_NAME_CHARS,
    MAX_SOURCE_CHARS,
    brief,
    brief_text,
    cap_problems,
    load_yaml,
    unknown_fields,
    whole,
)
from .names import NAME_RE, Names, aliases_of, fallback_of, fallback_problems, name_clashes
from .scale import autoscale_of, replicas_of
from .spec import parse_duration

__all__ = ["ModelSpec", "Profile", "is_mig_class", "parse", "parse_duration", "validate"]

ENGINES: tuple[str, ...] = typing.get_args(ModelSpec.model_fields["engine"].annotation)
CATALOG_FIELDS = catalog_names()
PROFILE_FIELDS = catalog_names(Profile)
SOURCE_SCHEMES = ("file://", "hf://", "https://", "http://")
CLASS_RE = re.compile(CLASS_PATTERN)
SHA256 = re.compile(SHA256_PATTERN)
# Fields with a rule of their own below; every other field is checked by plain().
_OWN_RULES = ("name", "source", "engine", "profile", "replicas", "replicas_max", "on_demand",
              "idle_stop_after_s", "args", "sha256", "slots", "aliases", "fallback",
              "autoscale")


def _number(problems: list[str], where: str, value: Any, limits: dict[str, Any],
            meta: dict[str, Any]) -> float | None:
    low = limits.get("gt", limits.get("ge"))
    high = limits.get("le", limits.get("lt"))
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) \
            or (low is not None and (value <= low if "gt" in limits else value < low)) \
            or (high is not None and (value >= high if "lt" in limits else value > high)):
        above = "above" if "gt" in limits else "at least"
        below = "below" if "lt" in limits else "at most"
        bound = f" (llmgw's {meta['bound']})" if "bound" in meta else ""
        problems.append(f"{where} must be a number{meta.get('unit', '')} {above} {low:g} and "
                        f"{below} {high:g}{bound}, not {brief(value)}")
        return None
    return float(value)


def plain(problems: list[str], where: str, cls: type[pydantic.BaseModel], name: str,
          value: Any) -> Any:
    """``value`` of the field ``name`` of ``cls`` checked against its definition alone
    (type, choices, bounds: api/catalog.py), or its default with a problem added. A None
    is the default for a field that may be None."""
    info = cls.model_fields[name]
    meta, limits = extra(cls, name), bounds(name, cls)
    optional = type(None) in typing.get_args(info.annotation)
    kind = next(k for k in typing.get_args(info.annotation) if k is not type(None)) \
        if optional else info.annotation
    fallback = None if info.is_required() else default(name, cls)
    if value is None and optional:
        return None
    if typing.get_origin(kind) is Literal:
        if value not in typing.get_args(kind):
            problems.append(f"{where} {brief(value)} is unknown; {meta.get('unknown', '')}")
            return fallback
        return value
    if kind is bool:
        if not isinstance(value, bool):
            problems.append(f"{where} must be true or false, not {brief(value)}")
            return fallback
        return value
    if kind is int:
        return whole(problems, where, value, limits.get("ge", limits.get("gt", 0)),
                    limits.get("le"), meta.get("bound"))
    if kind is float:
        if meta.get("duration") and isinstance(value, str):
            try:
                value = parse_duration(value)
            except ValueError as exc:
                problems.append(f"{where} {exc}")
                return fallback
        number = _number(problems, where, value, limits, meta)
        return fallback if number is None else number
    if isinstance(kind, type) and issubclass(kind, Frozen):
        return _mapping(problems, where, kind, value)
    raise TypeError(f"catalog/parse.py has no rule for {name}: {kind}")  # a new kind of field


def _mapping(problems: list[str], where: str, cls: type[Frozen], raw: Any) -> Any:
    """A nested value (``max_tokens``): a mapping of plain fields, then the class's own
    cross-field rules."""
    if not isinstance(raw, dict):
        example = ", ".join(f"{k}: ..." for k in catalog_names(cls))
        problems.append(f"{where} must be a mapping like {{{example}}}, not {brief(raw)}")
        return None
    before = len(problems)
    label = where.rsplit(": ", 1)[-1]
    unknown_fields(problems, where.rsplit(": ", 1)[0], f"{label}.", raw, catalog_names(cls))
    values = {k: plain(problems, f"{where}.{k}", cls, k, raw[k])
              for k in cls.model_fields if k in raw}
    if len(problems) > before:
        return None
    try:
        return cls(**values)
    except pydantic.ValidationError as exc:
        for err in exc.errors(include_url=False):
            problems.append(f"{where} {str(err['msg']).removeprefix('Value error, ')}")
        return None


def _profile(problems: list[str], who: str, raw: Any) -> Profile | None:
    if raw is None:
        problems.append(f"{who}: profile is required (the devices one replica takes); "
                        f"{extra(ModelSpec, 'profile')['required']}")
        return None
    if not isinstance(raw, dict):
        problems.append(f"{who}: profile must be a mapping like "
                        f"{{class: a100-80g, gpus: 1}}, not {brief(raw)}")
        return None
    unknown_fields(problems, who, "profile.", raw, PROFILE_FIELDS)
    klass = raw.get("class")
    if not isinstance(klass, str) or len(klass) > MAX_CLASS_CHARS or not CLASS_RE.match(klass):
        problems.append(f"{who}: profile.class is required: a lower-case device class like "
                        f"a100-80g, a100-80g-mig-3g.40gb or cpu, at most {MAX_CLASS_CHARS} "
                        f"characters (got {brief(klass)})")
        klass = "invalid"
    sizes = {k: plain(problems, f"{who}: profile.{k}", Profile, k, raw.get(k, 1))
             for k in ("gpus", "tp", "pp", "nodes")}
    memory = raw.get("memory_gb")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int | float)
                               or not 0 < memory <= MAX_MEMORY_GB):
        problems.append(f"{who}: profile.memory_gb must be a number of GB above zero and at "
                        f"most {MAX_MEMORY_GB:g} (llmgw's MAX_MEMORY_GB), not {brief(memory)}")
        memory = None
    if is_mig_class(klass):
        for key, value in sizes.items():
            if value > 1:
                problems.append(f"{who}: profile.{key} is {value}, but a MIG class "
                                f"({klass}) runs on exactly one instance; set {key}: 1 or "
                                "use a whole-GPU class")
    elif sizes["tp"] * sizes["pp"] != sizes["gpus"] * sizes["nodes"]:
        problems.append(f"{who}: profile tp x pp ({sizes['tp']} x {sizes['pp']}) must equal "
                        f"gpus x nodes ({sizes['gpus']} x {sizes['nodes']})")
    return Profile.model_validate({"class": klass, **sizes,
                                   "memory_gb": None if memory is None else float(memory)})


def _entry(problems: list[str], index: int, raw: Any) -> tuple[ModelSpec | None, Names | None]:
    """The entry as a spec (None when it has a problem), and its names as far as they
    could be read (None without a name), for the catalog-wide rules."""
    if not isinstance(raw, dict):
        problems.append(f"models[{index}] must be a mapping with name, source, engine and "
                        f"profile, not {brief(raw)}")
        return None, None
    name = raw.get("name")
    who = f"models[{index}] ({brief_text(name)})" if isinstance(name, str) else f"models[{index}]"
    before = len(problems)
    unknown_fields(problems, who, "", raw, CATALOG_FIELDS)
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not NAME_RE.match(name):
        problems.append(f"{who}: name {brief(name)} cannot be routed; use letters, digits and "
                        ". _ - : @ + / (no spaces, not starting with / or .), at most "
                        f"{MAX_NAME_CHARS} characters (llmgw's MAX_NAME_CHARS)")
    source = raw.get("source")
    _source(problems, who, source)
    engine = raw.get("engine")
    if engine is None:
        problems.append(f"{who}: engine is required; {extra(ModelSpec, 'engine')['required']}")
    else:
        engine = plain(problems, f"{who}: engine", ModelSpec, "engine", engine)
    profile = _profile(problems, who, raw.get("profile"))
    replicas = replicas_of(problems, who, raw)
    idle_s = _idle(problems, who, raw.get("idle_stop_after"), replicas.on_demand)
    args = _args(problems, who, raw.get("args", []), engine,
                 profile.klass if profile is not None else None)
    sha256 = raw.get("sha256")
    if sha256 is not None and (not isinstance(sha256, str) or len(sha256) != 64
                               or not SHA256.match(sha256.lower())):
        problems.append(f"{who}: sha256 must be 64 hexadecimal digits (sha256sum's output), "
                        f"not {brief(sha256)}")
    values = {k: plain(problems, f"{who}: {k}", ModelSpec, k, raw[k])
              for k in MODEL_FIELDS if k in raw and k not in _OWN_RULES}
    if ((sha256 is not None or values.get("size_bytes") is not None)
            and isinstance(source, str) and source.startswith("hf://")):
        problems.append(f"{who}: sha256 and size_bytes apply to https:// and file:// "
                        "sources; huggingface_hub checks hf:// downloads itself")
    slots = _slots(problems, who, raw.get("slots"), engine, args)
    autoscale = autoscale_of(problems, who, raw.get("autoscale"), replicas,
                             values.get("max_wait_s", default("max_wait_s")))
    aliases = aliases_of(problems, who, raw.get("aliases", []), name)
    fallback = fallback_of(problems, who, raw.get("fallback", []), name)
    names = Names(name, aliases, fallback) if isinstance(name, str) else None
    if len(problems) > before or profile is None:
        return None, names
    assert isinstance(name, str) and isinstance(source, str) and engine in ENGINES
    return ModelSpec(name=name, source=source, engine=engine, profile=profile,
                     replicas=replicas.count, replicas_max=replicas.maximum,
                     autoscale=autoscale, on_demand=replicas.on_demand,
                     idle_stop_after_s=idle_s, args=tuple(str(a) for a in args),
                     sha256=sha256.lower() if isinstance(sha256, str) else None,
                     slots=slots, aliases=aliases, fallback=fallback, **values), names


def _idle(problems: list[str], who: str, idle: Any, on_demand: bool) -> float | None:
    """``idle_stop_after`` (a duration) of an on-demand model, in seconds."""
    if idle is None:
        return None
    if not on_demand:
        problems.append(f"{who}: idle_stop_after applies only to on_demand models; "
                        "remove it, or set on_demand: true (or replicas.min 0)")
    try:
        seconds = parse_duration(idle)
    except ValueError as exc:
        problems.append(f"{who}: idle_stop_after {exc}")
        return None
    if seconds > MAX_IDLE_STOP_AFTER_S:
        problems.append(f"{who}: idle_stop_after must be at most "
                        f"{MAX_IDLE_STOP_AFTER_S / 86400:g}d (llmgw's MAX_IDLE_STOP_AFTER_S)")
    return seconds


def _slots(problems: list[str], who: str, slots: Any, engine: Any,
           args: list[Any]) -> int | None:
    """The entry's ``slots``: within its bounds, and what the engine's flag in the args
    says when they set it."""
    if slots is None:
        return None
    slots = plain(problems, f"{who}: slots", ModelSpec, "slots", slots)
    flags = SLOT_FLAGS.get(engine) if isinstance(engine, str) else None
    in_args = slots_from_args(engine, [str(a) for a in args]) if flags else None
    if flags and in_args is not None and in_args != slots:
        problems.append(f"{who}: slots is {slots} but args set {flags[0]} {in_args}; "
                        f"remove {flags[0]} from args (slots sets it) or make them agree")
    return slots  # type: ignore[no-any-return]


def _source(problems: list[str], who: str, source: Any) -> None:
    """A source the agent can fetch and store safely (weights/sources.py says why not)."""
    if source is None:
        problems.append(f"{who}: source is required; add source: file:///PATH (or an "
                        "absolute path, hf://ORG/REPO/FILE, https://URL)")
    elif not isinstance(source, str) or not (source.startswith(SOURCE_SCHEMES)
                                           or source.startswith("/")):
        problems.append(f"{who}: source {brief(source)} must be file:///PATH, an absolute "
                        "path, hf://ORG/REPO/FILE or https://URL")
    elif len(source) > MAX_SOURCE_CHARS:
        problems.append(f"{who}: source {brief(source)} is {len(source)} characters, over "
                        f"the maximum of {MAX_SOURCE_CHARS} (llmgw's MAX_SOURCE_CHARS)")
    elif not source.isprintable():
        problems.append(f"{who}: source {brief(source)} holds a control character (NUL, "
                        "newline, tab, ...); write it on one line")
    else:
        try:
            parse_source(source)
        except EngineError as exc:
            problems.append(f"{who}: {exc.message}")


def _args(problems: list[str], who: str, args: Any, engine: Any,
          klass: str | None) -> list[Any]:
    """The engine args: a bounded list of short strings (or numbers), none of them a flag the
    agent owns for ``engine``, all accepted by the engine that runs ``engine`` on ``klass``
    devices when that engine can say (engines/drivers.py ``args_problem``)."""
    if not isinstance(args, list):
        hint = (f"; write it as {brief_text(json.dumps(args.split()))}"
                if isinstance(args, str) and args.split() else "")
        problems.append(f"{who}: args must be a list of strings like "
                        f"[\"--ctx-size\", \"8192\"], not {brief(args)}{hint}")
        return []
    if len(args) > MAX_ARGS:
        problems.append(f"{who}: args has {len(args)} items, over the maximum of {MAX_ARGS} "
                        "(llmgw's MAX_ARGS)")
        return []
    bad = [a for a in args if not isinstance(a, str | int | float) or isinstance(a, bool)]
    if bad:
        problems.append(f"{who}: args must be a list of strings like "
                        f"[\"--ctx-size\", \"8192\"], not {brief(args)}")
        return []
    long = [i for i, a in enumerate(args) if len(str(a)) > MAX_ARG_CHARS]
    if long:
        problems.append(f"{who}: args[{long[0]}] is {len(str(args[long[0]]))} characters, "
                        f"over the maximum of {MAX_ARG_CHARS} (llmgw's MAX_ARG_CHARS)")
        return []
    if any("\0" in str(a) for a in args):
        problems.append(f"{who}: args hold a NUL character, which no command line can carry")
        return []
    if isinstance(engine, str):
        owned = owned_flags_in(engine, args)
        if owned:
            problems.append(f"{who}: {owned_flags_message(engine, owned)}")
        elif klass is not None:
            problem = args_problem(engine, klass, args)
            if problem:
                problems.append(f"{who}: {problem}")
    return args


def validate(document: Any, others: dict[str, tuple[str, ...]] | None = None
             ) -> list[ModelSpec]:
    """The models of a parsed catalog document, or CatalogError listing every problem:
    each entry's own, and the catalog-wide ones of every entry that has a name, also of an
    entry with problems of its own (an alias used twice, a fallback that names no model).
    ``others``: the models that stay beside the catalog (name -> aliases: the store's,
    without --prune), which fallbacks may name and aliases must not take."""
    problems: list[str] = []
    if not isinstance(document, dict) or "models" not in document:
        raise CatalogError("the catalog must be a mapping with a 'models' list",
                           details=["write it as: models: [{name: ..., source: ..., "
                                    "engine: llama.cpp, profile: {class: cpu}}]"])
    extra = [k for k in document if k != "models"]
    if extra:
        problems.append(f"catalog: {', '.join(brief_text(k) for k in extra[:5])} is not a known "
                        "top-level field; only 'models' is")
    entries = document["models"]
    if not isinstance(entries, list):
        raise CatalogError("the catalog's 'models' must be a list", details=[
            f"got {type(entries).__name__}"])
    if len(entries) > MAX_MODELS:
        raise CatalogError(f"the catalog has {len(entries)} models, over the maximum of "
                           f"{MAX_MODELS} (llmgw's MAX_MODELS); nothing was applied",
                           details=["split the fleet, or remove models nobody uses"])
    specs: list[ModelSpec] = []
    every: list[Names] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(sliced(entries)):   # a gevent worker's loop keeps serving
        spec, names = _entry(problems, index, raw)
        if names is not None and names.name not in seen:
            every.append(names)
        name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(name, str):
            if name in seen:
                problems.append(f"models[{index}] ({brief_text(name)}): name is also used by "
                                f"models[{seen[name]}]; names must be unique")
            seen.setdefault(name, index)
        if spec is not None:
            specs.append(spec)
    staying = {n: a for n, a in (others or {}).items() if n not in seen}
    problems += name_clashes(every, staying) + fallback_problems(every, staying)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        raise CatalogError(f"the catalog has {len(problems)} {noun}; nothing was applied",
                           details=cap_problems(problems))
    return specs


def parse(text: str, others: dict[str, tuple[str, ...]] | None = None) -> list[ModelSpec]:
    """Parse catalog YAML (JSON is YAML too) and validate it (``others``: the models that
    stay beside it, :func:`validate`). The text is read within the bounds of
    catalog/bounds.load_yaml (size, nesting, alias expansion)."""
    return validate(load_yaml(text), others)
