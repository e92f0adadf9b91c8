"""The catalog: parse and validate model entries (a pure function of the text).

Validation reports every problem at once, each naming the model and the field, and the
caller writes nothing when any entry is bad. Every count and length has a maximum
(catalog_bounds.py), the YAML is read within bounds of size, nesting and alias expansion, and
an error lists at most a bounded number of problems of bounded length. Args that set a flag
the agent owns (engines/owned.py) and sources whose downloaded name would not be one safe
file name in the weights directory (weights/sources.py) are refused here, at apply time.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .catalog_bounds import (
    MAX_ARG_CHARS,
    MAX_ARGS,
    MAX_CLASS_CHARS,
    MAX_GPUS,
    MAX_IDLE_STOP_AFTER_S,
    MAX_MEMORY_GB,
    MAX_MODELS,
    MAX_NAME_CHARS,
    MAX_NODES,
    MAX_PP,
    MAX_QUEUE_PER_MODEL,
    MAX_SIZE_BYTES,
    MAX_SLOTS_PER_REPLICA,
    MAX_SOURCE_CHARS,
    MAX_TP,
    MAX_WAIT_S,
    brief,
    brief_text,
    cap_problems,
    load_yaml,
    unknown_fields,
)
from .catalog_names import NAME_RE, aliases_of, fallback_of, name_clashes
from .catalog_scale import Autoscale, autoscale_of, replicas_of
from .engines.drivers import args_problem
from .engines.owned import owned_flags_in, owned_flags_message
from .engines.slots import SLOT_FLAGS, slots_from_args
from .errors import CatalogError, EngineError
from .weights.sources import parse_source

ENGINES = ("llama.cpp", "vllm")
MODEL_FIELDS = ("name", "source", "engine", "profile", "replicas", "on_demand",
                "idle_stop_after", "args", "strategy", "sha256", "size_bytes",
                "routing", "slots", "max_queue", "max_wait_s", "aliases", "fallback",
                "autoscale")
STRATEGIES = ("binpack", "spread")
ROUTINGS = ("prefix-affinity", "least-outstanding")
DEFAULT_MAX_QUEUE = 100
DEFAULT_MAX_WAIT_S = 30.0
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
PROFILE_FIELDS = ("class", "gpus", "tp", "pp", "nodes", "memory_gb")
SOURCE_SCHEMES = ("file://", "hf://", "https://", "http://")
CLASS_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}
_MAXIMA = {"gpus": MAX_GPUS, "tp": MAX_TP, "pp": MAX_PP, "nodes": MAX_NODES}
_MAXIMUM_NAMES = {"gpus": "MAX_GPUS", "tp": "MAX_TP", "pp": "MAX_PP", "nodes": "MAX_NODES"}


@dataclass(frozen=True)
class Profile:
    klass: str
    gpus: int = 1
    tp: int = 1
    pp: int = 1
    nodes: int = 1
    memory_gb: float | None = None

    @property
    def is_mig(self) -> bool:
        return is_mig_class(self.klass)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"class": self.klass, "gpus": self.gpus, "tp": self.tp,
                               "pp": self.pp, "nodes": self.nodes}
        if self.memory_gb is not None:
            out["memory_gb"] = self.memory_gb
        return out


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str
    engine: str
    profile: Profile
    replicas: int = 1
    on_demand: bool = False
    idle_stop_after_s: float | None = None
    args: tuple[str, ...] = field(default_factory=tuple)
    strategy: str = "binpack"           # binpack | spread (replicas on different nodes)
    sha256: str | None = None           # checked after a download, when given
    size_bytes: int | None = None       # checked after a download, when given
    # Admission and routing (docs/routing.md): requests one replica serves at once (None:
    # what its args or its engine's default say, engines/slots.py), how many may wait in
    # a router for a slot and for how long, and how a replica is picked.
    routing: str = "prefix-affinity"    # prefix-affinity | least-outstanding
    slots: int | None = None
    max_queue: int = DEFAULT_MAX_QUEUE
    max_wait_s: float = DEFAULT_MAX_WAIT_S
    # Other names clients may use for it ("model": an alias); each names this model only.
    aliases: tuple[str, ...] = field(default_factory=tuple)
    # Models its requests go to, in order, when it is parked, unplaceable or at capacity.
    fallback: tuple[str, ...] = field(default_factory=tuple)
    # replicas: {min, max} (catalog_scale.py): the max when above ``replicas`` (the min;
    # None: fixed), and how the control service scales in between (None: it does not).
    replicas_max: int | None = None
    autoscale: Autoscale | None = None

    @property
    def definition_hash(self) -> str:
        """Changes when source (with its checksum and size), engine, profile or args change
        (a new definition unparks), and so does ``slots`` when set (it is a flag of the
        launch). The strategy, routing and queue are not part of the definition."""
        fields: dict[str, Any] = {"source": self.source, "engine": self.engine,
                                  "profile": self.profile.to_dict(), "args": list(self.args)}
        if self.sha256 is not None:
            fields["sha256"] = self.sha256
        if self.size_bytes is not None:
            fields["size_bytes"] = self.size_bytes
        if self.slots is not None:
            fields["slots"] = self.slots
        body = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["profile"] = self.profile.to_dict()
        out["args"] = list(self.args)
        return out


def is_mig_class(klass: str) -> bool:
    return "-mig-" in klass


def parse_duration(value: Any) -> float:
    """``30m``, ``1h``, ``90s``, ``2d`` or a number of seconds (finite)."""
    if isinstance(value, bool):
        raise ValueError("is a boolean")
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            raise ValueError("is too large a number of seconds") from None
        if not math.isfinite(seconds):
            raise ValueError(f"must be a finite number of seconds, not {seconds}")
        if seconds <= 0:
            raise ValueError("must be above zero")
        return seconds
    text = str(value).strip() if isinstance(value, str) else ""
    match = DURATION_RE.match(text) if len(text) <= 32 else None
    if not match:
        raise ValueError(f"{brief(value)} is not a duration; write it like 30m, 1h or 90s")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError("must be above zero")
    return seconds


def _int(problems: list[str], where: str, value: Any, minimum: int,
         maximum: int | None = None, maximum_name: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{where} must be a whole number, not {brief(value)}")
        return minimum
    if value < minimum:
        problems.append(f"{where} must be at least {minimum}, not {brief(value)}")
    elif maximum is not None and value > maximum:
        problems.append(f"{where} must be at most {maximum} (llmgw's {maximum_name}), "
                        f"not {brief(value)}")
        return maximum
    return value


def _profile(problems: list[str], who: str, raw: Any) -> Profile | None:
    if raw is None:
        problems.append(f"{who}: profile is required (the devices one replica takes); add "
                        "profile: {class: cpu} or profile: {class: a100-80g, gpus: 1}")
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
    sizes = {k: _int(problems, f"{who}: profile.{k}", raw.get(k, 1), 1, _MAXIMA[k],
                     _MAXIMUM_NAMES[k])
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
    return Profile(klass=klass, memory_gb=None if memory is None else float(memory), **sizes)


def _entry(problems: list[str], index: int, raw: Any) -> ModelSpec | None:
    if not isinstance(raw, dict):
        problems.append(f"models[{index}] must be a mapping with name, source, engine and "
                        f"profile, not {brief(raw)}")
        return None
    name = raw.get("name")
    who = f"models[{index}] ({brief_text(name)})" if isinstance(name, str) else f"models[{index}]"
    before = len(problems)
    unknown_fields(problems, who, "", raw, MODEL_FIELDS)
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not NAME_RE.match(name):
        problems.append(f"{who}: name {brief(name)} cannot be routed; use letters, digits and "
                        ". _ - : @ + / (no spaces, not starting with / or .), at most "
                        f"{MAX_NAME_CHARS} characters (llmgw's MAX_NAME_CHARS)")
    source = raw.get("source")
    _source(problems, who, source)
    engine = raw.get("engine")
    if engine is None:
        problems.append(f"{who}: engine is required; add engine: llama.cpp (GGUF files) or "
                        "engine: vllm")
    elif engine not in ENGINES:
        problems.append(f"{who}: engine {brief(engine)} is unknown; use one of "
                        f"{', '.join(ENGINES)}")
    profile = _profile(problems, who, raw.get("profile"))
    replicas = replicas_of(problems, who, raw)
    on_demand = replicas.on_demand
    idle = raw.get("idle_stop_after")
    idle_s: float | None = None
    if idle is not None:
        if not on_demand:
            problems.append(f"{who}: idle_stop_after applies only to on_demand models; "
                            "remove it, or set on_demand: true (or replicas.min 0)")
        try:
            idle_s = parse_duration(idle)
        except ValueError as exc:
            problems.append(f"{who}: idle_stop_after {exc}")
        if idle_s is not None and idle_s > MAX_IDLE_STOP_AFTER_S:
            problems.append(f"{who}: idle_stop_after must be at most "
                            f"{MAX_IDLE_STOP_AFTER_S / 86400:g}d (llmgw's "
                            "MAX_IDLE_STOP_AFTER_S)")
    args = _args(problems, who, raw.get("args", []), engine,
                 profile.klass if profile is not None else None)
    strategy = raw.get("strategy", "binpack")
    if strategy not in STRATEGIES:
        problems.append(f"{who}: strategy {brief(strategy)} is unknown; use binpack (fill "
                        "busy nodes first, the default) or spread (replicas on different "
                        "nodes)")
    sha256 = raw.get("sha256")
    if sha256 is not None and (not isinstance(sha256, str) or len(sha256) != 64
                               or not SHA256_RE.match(sha256.lower())):
        problems.append(f"{who}: sha256 must be 64 hexadecimal digits (sha256sum's output), "
                        f"not {brief(sha256)}")
    size = raw.get("size_bytes")
    if size is not None:
        size = _int(problems, f"{who}: size_bytes", size, 1, MAX_SIZE_BYTES, "MAX_SIZE_BYTES")
    if (sha256 is not None or size is not None) and isinstance(source, str) \
            and source.startswith("hf://"):
        problems.append(f"{who}: sha256 and size_bytes apply to https:// and file:// "
                        "sources; huggingface_hub checks hf:// downloads itself")
    routing, slots, max_queue, max_wait_s = _admission(problems, who, raw, engine, args)
    autoscale = autoscale_of(problems, who, raw.get("autoscale"), replicas, max_wait_s)
    aliases = aliases_of(problems, who, raw.get("aliases", []), name)
    fallback = fallback_of(problems, who, raw.get("fallback", []), name)
    if len(problems) > before or profile is None:
        return None
    assert isinstance(name, str) and isinstance(source, str) and isinstance(engine, str)
    return ModelSpec(name=name, source=source, engine=engine, profile=profile,
                     replicas=replicas.count, replicas_max=replicas.maximum,
                     autoscale=autoscale, on_demand=on_demand, idle_stop_after_s=idle_s,
                     args=tuple(str(a) for a in args), strategy=str(strategy),
                     sha256=sha256.lower() if isinstance(sha256, str) else None,
                     size_bytes=size, routing=routing, slots=slots, max_queue=max_queue,
                     max_wait_s=max_wait_s, aliases=aliases, fallback=fallback)


def _admission(problems: list[str], who: str, raw: dict[str, Any], engine: Any,
               args: list[Any]) -> tuple[str, int | None, int, float]:
    """routing, slots, max_queue and max_wait_s of an entry, each with its default."""
    routing = raw.get("routing", "prefix-affinity")
    if routing not in ROUTINGS:
        problems.append(f"{who}: routing {brief(routing)} is unknown; use prefix-affinity "
                        "(the default: requests sharing a prompt prefix go to the replica "
                        "that has it cached) or least-outstanding")
        routing = "prefix-affinity"
    slots = raw.get("slots")
    if slots is not None:
        slots = _int(problems, f"{who}: slots", slots,
                     1, MAX_SLOTS_PER_REPLICA, "MAX_SLOTS_PER_REPLICA")
        flags = SLOT_FLAGS.get(engine) if isinstance(engine, str) else None
        in_args = slots_from_args(engine, [str(a) for a in args]) if flags else None
        if flags and in_args is not None and in_args != slots:
            problems.append(f"{who}: slots is {slots} but args set {flags[0]} {in_args}; "
                            f"remove {flags[0]} from args (slots sets it) or make them agree")
    max_queue = _int(problems, f"{who}: max_queue",
                     raw.get("max_queue", DEFAULT_MAX_QUEUE), 0, MAX_QUEUE_PER_MODEL,
                     "MAX_QUEUE_PER_MODEL")
    wait = raw.get("max_wait_s", DEFAULT_MAX_WAIT_S)
    if isinstance(wait, bool) or not isinstance(wait, int | float) \
            or not 0 < wait <= MAX_WAIT_S:
        problems.append(f"{who}: max_wait_s must be a number of seconds above 0 and at most "
                        f"{MAX_WAIT_S:g} (llmgw's MAX_WAIT_S), not {brief(wait)}")
        wait = DEFAULT_MAX_WAIT_S
    return str(routing), slots, max_queue, float(wait)


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


def validate(document: Any) -> list[ModelSpec]:
    """The models of a parsed catalog document, or CatalogError listing every problem."""
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
    seen: dict[str, int] = {}
    for index, raw in enumerate(entries):
        spec = _entry(problems, index, raw)
        name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(name, str):
            if name in seen:
                problems.append(f"models[{index}] ({brief_text(name)}): name is also used by "
                                f"models[{seen[name]}]; names must be unique")
            seen.setdefault(name, index)
        if spec is not None:
            specs.append(spec)
    problems += name_clashes(specs)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        raise CatalogError(f"the catalog has {len(problems)} {noun}; nothing was applied",
                           details=cap_problems(problems))
    return specs


def parse(text: str) -> list[ModelSpec]:
    """Parse catalog YAML (JSON is YAML too) and validate it. The text is read within the
    bounds of catalog_bounds.load_yaml (size, nesting, alias expansion)."""
    return validate(load_yaml(text))


def spec_from_row(row: Any) -> ModelSpec:
    """A ModelSpec from a ``models`` table row."""
    prof = json.loads(row.profile)
    profile = Profile(klass=prof["class"], gpus=prof.get("gpus", 1), tp=prof.get("tp", 1),
                      pp=prof.get("pp", 1), nodes=prof.get("nodes", 1),
                      memory_gb=prof.get("memory_gb"))
    return ModelSpec(name=row.name, source=row.source, engine=row.engine, profile=profile,
                     replicas=row.replicas, on_demand=bool(row.on_demand),
                     idle_stop_after_s=row.idle_stop_after_s, args=tuple(json.loads(row.args)),
                     strategy=row.strategy or "binpack", sha256=row.sha256,
                     size_bytes=row.size_bytes, **_admission_of(row),
                     aliases=tuple(json.loads(getattr(row, "aliases", None) or "[]")),
                     fallback=tuple(json.loads(getattr(row, "fallback", None) or "[]")),
                     replicas_max=getattr(row, "replicas_max", None),
                     autoscale=autoscale_from_text(getattr(row, "autoscale", None)))


def autoscale_from_text(text: str | None) -> Autoscale | None:
    """A row's stored autoscale settings (JSON written by the store from a spec)."""
    return Autoscale(**json.loads(text)) if text else None


def _admission_of(row: Any) -> dict[str, Any]:
    """A row's admission settings, each default when the row lacks it (a row built
    before revision 0008, or a test's)."""
    queue = getattr(row, "max_queue", None)
    return {"routing": getattr(row, "routing", None) or "prefix-affinity",
            "slots": getattr(row, "slots", None),
            "max_queue": DEFAULT_MAX_QUEUE if queue is None else queue,
            "max_wait_s": getattr(row, "max_wait_s", None) or DEFAULT_MAX_WAIT_S}
