"""The catalog: parse and validate model entries (a pure function of the text).

Validation reports every problem at once, each naming the model and the field, and the
caller writes nothing when any entry is bad.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

from .errors import CatalogError

ENGINES = ("llama.cpp", "vllm")
MODEL_FIELDS = ("name", "source", "engine", "profile", "replicas", "on_demand",
                "idle_stop_after", "args", "strategy", "sha256", "size_bytes")
STRATEGIES = ("binpack", "spread")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
PROFILE_FIELDS = ("class", "gpus", "tp", "pp", "nodes", "memory_gb")
SOURCE_SCHEMES = ("file://", "hf://", "https://", "http://")
# What a client can put in "model" and the router can route: no spaces, no leading slash.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]*(/[A-Za-z0-9._:@+-]+)*$")
CLASS_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d)?$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


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

    @property
    def definition_hash(self) -> str:
        """Changes when source (with its checksum and size), engine, profile or args change
        (a new definition unparks). The strategy is not part of the definition."""
        fields: dict[str, Any] = {"source": self.source, "engine": self.engine,
                                  "profile": self.profile.to_dict(), "args": list(self.args)}
        if self.sha256 is not None:
            fields["sha256"] = self.sha256
        if self.size_bytes is not None:
            fields["size_bytes"] = self.size_bytes
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
    """``30m``, ``1h``, ``90s``, ``2d`` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("is a boolean")
    if isinstance(value, int | float):
        if value <= 0:
            raise ValueError("must be above zero")
        return float(value)
    match = DURATION_RE.match(str(value).strip())
    if not match:
        raise ValueError(f"{value!r} is not a duration; write it like 30m, 1h or 90s")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError("must be above zero")
    return seconds


def _int(problems: list[str], where: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{where} must be a whole number, not {value!r}")
        return minimum
    if value < minimum:
        problems.append(f"{where} must be at least {minimum}, not {value}")
    return value


def _profile(problems: list[str], who: str, raw: Any) -> Profile | None:
    if not isinstance(raw, dict):
        problems.append(f"{who}: profile must be a mapping like "
                        "{class: a100-80g, gpus: 1}, not {raw!r}")
        return None
    for key in raw:
        if key not in PROFILE_FIELDS:
            problems.append(f"{who}: profile.{key} is not a known field; "
                            f"known: {', '.join(PROFILE_FIELDS)}")
    klass = raw.get("class")
    if not isinstance(klass, str) or not CLASS_RE.match(klass):
        problems.append(f"{who}: profile.class is required: a lower-case device class like "
                        f"a100-80g, a100-80g-mig-3g.40gb or cpu (got {klass!r})")
        klass = "invalid"
    sizes = {k: _int(problems, f"{who}: profile.{k}", raw.get(k, 1), 1)
             for k in ("gpus", "tp", "pp", "nodes")}
    memory = raw.get("memory_gb")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int | float)
                               or memory <= 0):
        problems.append(f"{who}: profile.memory_gb must be a number of GB above zero, "
                        f"not {memory!r}")
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
                        f"profile, not {raw!r}")
        return None
    name = raw.get("name")
    who = f"models[{index}] ({name})" if isinstance(name, str) else f"models[{index}]"
    before = len(problems)
    for key in raw:
        if key not in MODEL_FIELDS:
            problems.append(f"{who}: {key} is not a known field; known: "
                            f"{', '.join(MODEL_FIELDS)}")
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > 200:
        problems.append(f"{who}: name {name!r} cannot be routed; use letters, digits and "
                        ". _ - : @ + / (no spaces, not starting with / or .)")
    source = raw.get("source")
    if not isinstance(source, str) or not (source.startswith(SOURCE_SCHEMES)
                                           or source.startswith("/")):
        problems.append(f"{who}: source {source!r} must be file:///PATH, an absolute path, "
                        "hf://ORG/REPO/FILE or https://URL")
    engine = raw.get("engine")
    if engine not in ENGINES:
        problems.append(f"{who}: engine {engine!r} is unknown; use one of "
                        f"{', '.join(ENGINES)}")
    profile = _profile(problems, who, raw.get("profile"))
    replicas = _int(problems, f"{who}: replicas", raw.get("replicas", 1), 0)
    on_demand = raw.get("on_demand", False)
    if not isinstance(on_demand, bool):
        problems.append(f"{who}: on_demand must be true or false, not {on_demand!r}")
    idle = raw.get("idle_stop_after")
    idle_s: float | None = None
    if idle is not None:
        if on_demand is not True:
            problems.append(f"{who}: idle_stop_after applies only to on_demand models; "
                            "remove it or set on_demand: true")
        try:
            idle_s = parse_duration(idle)
        except ValueError as exc:
            problems.append(f"{who}: idle_stop_after {exc}")
    args = raw.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str | int | float)
                                             and not isinstance(a, bool) for a in args):
        problems.append(f"{who}: args must be a list of strings like "
                        "[\"--ctx-size\", \"8192\"], not {args!r}")
        args = []
    strategy = raw.get("strategy", "binpack")
    if strategy not in STRATEGIES:
        problems.append(f"{who}: strategy {strategy!r} is unknown; use binpack (fill busy "
                        "nodes first, the default) or spread (replicas on different nodes)")
    sha256 = raw.get("sha256")
    if sha256 is not None and (not isinstance(sha256, str)
                               or not SHA256_RE.match(sha256.lower())):
        problems.append(f"{who}: sha256 must be 64 hexadecimal digits (sha256sum's output), "
                        f"not {sha256!r}")
    size = raw.get("size_bytes")
    if size is not None:
        size = _int(problems, f"{who}: size_bytes", size, 1)
    if (sha256 is not None or size is not None) and isinstance(source, str) \
            and source.startswith("hf://"):
        problems.append(f"{who}: sha256 and size_bytes apply to https:// and file:// "
                        "sources; huggingface_hub checks hf:// downloads itself")
    if len(problems) > before or profile is None:
        return None
    assert isinstance(name, str) and isinstance(source, str) and isinstance(engine, str)
    return ModelSpec(name=name, source=source, engine=engine, profile=profile,
                     replicas=replicas, on_demand=bool(on_demand), idle_stop_after_s=idle_s,
                     args=tuple(str(a) for a in args), strategy=str(strategy),
                     sha256=sha256.lower() if isinstance(sha256, str) else None,
                     size_bytes=size)


def validate(document: Any) -> list[ModelSpec]:
    """The models of a parsed catalog document, or CatalogError listing every problem."""
    problems: list[str] = []
    if not isinstance(document, dict) or "models" not in document:
        raise CatalogError("the catalog must be a mapping with a 'models' list",
                           details=["write it as: models: [{name: ..., source: ..., "
                                    "engine: llama.cpp, profile: {class: cpu}}]"])
    extra = [k for k in document if k != "models"]
    if extra:
        problems.append(f"catalog: {', '.join(map(str, extra))} is not a known top-level "
                        "field; only 'models' is")
    entries = document["models"]
    if not isinstance(entries, list):
        raise CatalogError("the catalog's 'models' must be a list", details=[
            f"got {type(entries).__name__}"])
    specs: list[ModelSpec] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(entries):
        spec = _entry(problems, index, raw)
        name = raw.get("name") if isinstance(raw, dict) else None
        if isinstance(name, str):
            if name in seen:
                problems.append(f"models[{index}] ({name}): name is also used by "
                                f"models[{seen[name]}]; names must be unique")
            seen.setdefault(name, index)
        if spec is not None:
            specs.append(spec)
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        raise CatalogError(f"the catalog has {len(problems)} {noun}; nothing was applied",
                           details=problems)
    return specs


def parse(text: str) -> list[ModelSpec]:
    """Parse catalog YAML (JSON is YAML too) and validate it."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise CatalogError(f"the catalog is not valid YAML{where}: {problem}; "
                           "nothing was applied") from None
    return validate(document)


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
                     size_bytes=row.size_bytes)
