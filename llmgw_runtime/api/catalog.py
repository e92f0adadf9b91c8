"""The catalog entry: the one definition of every per-model field.

A field is declared once, here, with its type, default, bounds and the sentence that
documents it. Everything else is derived from these classes, not written again by hand:
the catalog's parsing (catalog/parse.py reads defaults, bounds and choices from here), the
store's row mapping (store/models.py), the routes table's per-model part (``RouteFields``,
which :class:`~llmgw_runtime.api.router.RouteModel` extends), the admin answer
(:class:`~llmgw_runtime.api.admin.Model` extends :class:`ModelSpec`), the generated OpenAPI
of the catalog endpoints (:func:`catalog_schema`), and the checks that the Ansible
collection's literals (it runs where this package is not installed) and docs/catalog.md's
field table agree (tests/collection/test_llmgw_model_fields.py,
tests/test_doc_catalog_fields.py).

Adding a per-model field: one line in :class:`ModelSpec` (or :class:`RouteFields` when the
routers need it), a store migration, and the code that uses it; then the tests above name
what else must say it (the collection's option, its documentation and default, the row of
docs/catalog.md).

Field metadata (``json_schema_extra``): ``bound`` names the ``MAX_*`` of catalog/bounds.py
an error message cites; ``unit`` words a number's unit in errors; ``unknown`` is the fix an
unknown choice's error gives; ``required`` the fix for a missing field; ``catalog`` the JSON
Schema of the form the catalog writes when it differs from the stored one (``replicas: {min,
max}``, ``sha256`` in either case; None: the catalog does not write the field), with
``catalog_name`` when its name differs too (``idle_stop_after``); ``duration`` marks a number
of seconds the catalog may also write as ``30m``, ``1h``, ``90s`` or ``2d``
(catalog/spec.py); ``hash`` marks the fields of the definition (a change of them is a new
definition, which unparks).
"""

from __future__ import annotations

import hashlib
import json
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..catalog.bounds import (
    MAX_ALIASES,
    MAX_ARG_CHARS,
    MAX_ARGS,
    MAX_AUTOSCALE_WINDOW_S,
    MAX_CLASS_CHARS,
    MAX_DRAIN_TIMEOUT_S,
    MAX_FALLBACKS,
    MAX_GPUS,
    MAX_IDLE_STOP_AFTER_S,
    MAX_MEMORY_GB,
    MAX_NAME_CHARS,
    MAX_NODES,
    MAX_PP,
    MAX_QUEUE_PER_MODEL,
    MAX_REPLICAS,
    MAX_SIZE_BYTES,
    MAX_SLOTS_PER_REPLICA,
    MAX_SOURCE_CHARS,
    MAX_TOKENS_CAP,
    MAX_TP,
    MAX_WAIT_S,
)
from ..catalog.spec import DURATION_RE

# What a client can put in "model" and the router can route: no spaces, no leading slash.
MODEL_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]*(/[A-Za-z0-9._:@+-]+)*$"
CLASS_RE = r"^[a-z0-9][a-z0-9._-]*$"
SHA256_RE = r"^[0-9a-f]{64}$"

Engine = Literal["llama.cpp", "vllm"]
Strategy = Literal["binpack", "spread"]
Routing = Literal["prefix-affinity", "least-outstanding"]
ModelName = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_NAME_CHARS,
                                 pattern=MODEL_NAME_RE)]


class Meta:
    """A field's metadata for llmgw (the module docstring lists the keys): kept on the
    field, never written into its JSON Schema."""

    def __init__(self, **values: Any) -> None:
        self.values = values

    def __call__(self, schema: dict[str, Any]) -> None:
        """Leave the field's JSON Schema as pydantic made it."""


class Frozen(BaseModel):
    """A catalog value: unknown fields refused, nothing coerced but lists into tuples."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, allow_inf_nan=False,
                              populate_by_name=True)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def is_mig_class(klass: str) -> bool:
    return "-mig-" in klass


class Profile(Frozen):
    """The devices one replica takes: a device class and how many of them."""

    klass: str = Field(alias="class", max_length=MAX_CLASS_CHARS, pattern=CLASS_RE,
                       description="device class: cpu, a100-80g, a100-80g-mig-3g.40gb, ...")
    gpus: int = Field(1, ge=1, le=MAX_GPUS, description="devices per node",
                      json_schema_extra=Meta(bound="MAX_GPUS"))
    tp: int = Field(1, ge=1, le=MAX_TP, description="tensor-parallel size",
                    json_schema_extra=Meta(bound="MAX_TP"))
    pp: int = Field(1, ge=1, le=MAX_PP, description="pipeline-parallel size",
                    json_schema_extra=Meta(bound="MAX_PP"))
    nodes: int = Field(1, ge=1, le=MAX_NODES, description="nodes of one replica",
                       json_schema_extra=Meta(bound="MAX_NODES"))
    memory_gb: float | None = Field(None, gt=0, le=MAX_MEMORY_GB,
                                    description="device memory one replica needs, in GB",
                                    json_schema_extra=Meta(bound="MAX_MEMORY_GB"))

    @property
    def is_mig(self) -> bool:
        return is_mig_class(self.klass)

    def to_dict(self) -> dict[str, Any]:
        """As the definition hash and the store write it: memory_gb only when set."""
        out = self.model_dump(mode="json", by_alias=True)
        if self.memory_gb is None:
            del out["memory_gb"]
        return out


class Autoscale(Frozen):
    """How a model with a replica range is scaled (docs/autoscaling.md)."""

    wait_target_s: float = Field(default=2.0, gt=0, le=MAX_WAIT_S, description=(
        "scale up when requests wait longer than this (p90) ..."), json_schema_extra=Meta(
        bound="MAX_WAIT_S", duration=True))
    up_after_s: float = Field(default=30.0, gt=0, le=MAX_AUTOSCALE_WINDOW_S, description=(
        "... for this long (or are refused for capacity)"),
        json_schema_extra=Meta(bound="MAX_AUTOSCALE_WINDOW_S", duration=True))
    busy_below: float = Field(default=0.3, gt=0, lt=1, description=(
        "scale down when under this share of the slots is busy ..."))
    down_after_s: float = Field(default=300.0, gt=0, le=MAX_AUTOSCALE_WINDOW_S, description=(
        "... for this long, nothing waiting"), json_schema_extra=Meta(
        bound="MAX_AUTOSCALE_WINDOW_S", duration=True))
    cooldown_s: float = Field(default=60.0, gt=0, le=MAX_AUTOSCALE_WINDOW_S, description=(
        "at least this long between two steps"), json_schema_extra=Meta(
        bound="MAX_AUTOSCALE_WINDOW_S", duration=True))


class MaxTokens(Frozen):
    """A model's cap on the tokens one answer may generate (docs/catalog.md)."""

    default: int | None = Field(None, ge=1, le=MAX_TOKENS_CAP, description=(
        "what a request that sets no max_tokens gets"), json_schema_extra=Meta(bound="MAX_TOKENS_CAP"))
    max: int | None = Field(None, ge=1, le=MAX_TOKENS_CAP, description=(
        "the most a request may ask for"), json_schema_extra=Meta(bound="MAX_TOKENS_CAP"))
    clamp: bool = Field(False, description=(
        "true: a request above max is lowered to max; false: it is refused with a 400"))

    @model_validator(mode="after")
    def _default_within_max(self) -> MaxTokens:
        if self.default is not None and self.max is not None and self.default > self.max:
            raise ValueError(f"default ({self.default}) is above max ({self.max}); lower "
                             "the default or raise the max")
        return self


class Rollout(Frozen):
    """How a new definition replaces a model's running replicas (docs/operations.md)."""

    max_surge: int = Field(1, ge=0, le=MAX_REPLICAS, description=(
        "new replicas started beside the old ones before an old one drains"),
        json_schema_extra=Meta(bound="MAX_REPLICAS"))
    max_unavailable: int = Field(0, ge=0, le=MAX_REPLICAS, description=(
        "old replicas that may drain before their replacement is ready (1 for a fleet "
        "with no room to start one more)"), json_schema_extra=Meta(bound="MAX_REPLICAS"))
    canary_percent: int = Field(0, ge=0, le=99, description=(
        "0: replace every replica; N: run one new replica beside the old ones with N% of "
        "the requests until `llmgw ctl rollout promote`"))

    @model_validator(mode="after")
    def _can_progress(self) -> Rollout:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError("max_surge and max_unavailable are both 0, so no replica could "
                             "ever be replaced; set max_surge: 1 (start the new one first) "
                             "or max_unavailable: 1 (stop an old one first)")
        return self


class RouteFields(Frozen):
    """The fields of an entry the routers need: the routes table carries them as they are
    (api/router.py ``RouteModel`` extends this class)."""

    name: ModelName = Field(description="what clients put in \"model\"", json_schema_extra=Meta(
        required="add name: a routable name like qwen2.5-7b"))
    on_demand: bool = Field(False, description=(
        "no replica until the first request (the same as replicas.min 0)"))
    routing: Routing = Field("prefix-affinity", description=(
        "how a replica is picked among those with a free slot"), json_schema_extra=Meta(
        unknown="use prefix-affinity (the default: requests sharing a prompt prefix go to "
                "the replica that has it cached) or least-outstanding"))
    max_queue: int = Field(100, ge=0, le=MAX_QUEUE_PER_MODEL, description=(
        "requests that may wait for a slot in one router (0: refuse at once)"),
        json_schema_extra=Meta(bound="MAX_QUEUE_PER_MODEL"))
    max_wait_s: float = Field(default=30.0, gt=0, le=MAX_WAIT_S, description=(
        "how long one request may wait for a slot, in seconds"),
        json_schema_extra=Meta(bound="MAX_WAIT_S", unit=" of seconds"))
    aliases: tuple[ModelName, ...] = Field((), max_length=MAX_ALIASES, strict=False,
                                           description="other names clients may use for it",
                                           json_schema_extra=Meta(bound="MAX_ALIASES"))
    fallback: tuple[ModelName, ...] = Field((), max_length=MAX_FALLBACKS, strict=False,
                                            description=(
        "models its requests go to, in order, when it is parked, unplaceable or at capacity"),
        json_schema_extra=Meta(bound="MAX_FALLBACKS"))
    max_tokens: MaxTokens | None = Field(None, description=(
        "{default: N, max: M, clamp: false}: the tokens one answer may generate"))


class ModelSpec(RouteFields):
    """One model of the catalog, as the control service stores and plans it: every field
    with its default filled in (catalog/parse.py reads the catalog's YAML into it)."""

    source: str = Field(max_length=MAX_SOURCE_CHARS, description=(
        "file:///PATH, an absolute path, hf://ORG/REPO/FILE or https://URL"), json_schema_extra=Meta(
        bound="MAX_SOURCE_CHARS", hash=True,
        required="add source: file:///PATH (or an absolute path, hf://ORG/REPO/FILE, "
                 "https://URL)"))
    engine: Engine = Field(description="the engine that serves it", json_schema_extra=Meta(
        hash=True, unknown="use one of llama.cpp, vllm",
        required="add engine: llama.cpp (GGUF files) or engine: vllm"))
    profile: Profile = Field(description="the devices one replica takes", json_schema_extra=Meta(
        hash=True, required="add profile: {class: cpu} or profile: {class: a100-80g, "
                            "gpus: 1}"))
    replicas: int = Field(1, ge=0, le=MAX_REPLICAS, description=(
        "replicas kept running (the min of a range)"), json_schema_extra=Meta(
        bound="MAX_REPLICAS", catalog={"oneOf": [
            {"type": "integer", "minimum": 0, "maximum": MAX_REPLICAS},
            {"type": "object", "required": ["min", "max"], "additionalProperties": False,
             "properties": {"min": {"type": "integer", "minimum": 0,
                                    "maximum": MAX_REPLICAS},
                            "max": {"type": "integer", "minimum": 1,
                                    "maximum": MAX_REPLICAS}}}]}))
    replicas_max: int | None = Field(None, ge=1, le=MAX_REPLICAS, description=(
        "the max of replicas: {min, max} (None: a fixed number)"), json_schema_extra=Meta(
        bound="MAX_REPLICAS", catalog=None))
    idle_stop_after_s: float | None = Field(None, gt=0, le=MAX_IDLE_STOP_AFTER_S,
                                            description=(
        "an on-demand model's replicas stop after this long unused"), json_schema_extra=Meta(
        bound="MAX_IDLE_STOP_AFTER_S", catalog_name="idle_stop_after", duration=True))
    args: tuple[Annotated[str, Field(max_length=MAX_ARG_CHARS)], ...] = Field(
        (), max_length=MAX_ARGS, strict=False, description=(
            "engine arguments, a list like [\"--ctx-size\", \"8192\"]"),
        json_schema_extra=Meta(bound="MAX_ARGS", hash=True, catalog={
            "type": "array", "maxItems": MAX_ARGS, "items": {   # a number is read as text
                "type": ["string", "number"], "maxLength": MAX_ARG_CHARS}}))
    strategy: Strategy = Field("binpack", description=(
        "binpack: fill busy nodes first; spread: replicas on different nodes"), json_schema_extra=Meta(
        unknown="use binpack (fill busy nodes first, the default) or spread (replicas on "
                "different nodes)"))
    sha256: str | None = Field(None, pattern=SHA256_RE, description=(
        "checked after a download (https:// and file:// sources)"), json_schema_extra=Meta(
        hash=True, catalog={"anyOf": [{"type": "string", "pattern": "^[0-9a-fA-F]{64}$"},
                                      {"type": "null"}]}))    # stored in lower case
    size_bytes: int | None = Field(None, ge=1, le=MAX_SIZE_BYTES, description=(
        "checked after a download (https:// and file:// sources)"), json_schema_extra=Meta(
        bound="MAX_SIZE_BYTES", hash=True))
    slots: int | None = Field(None, ge=1, le=MAX_SLOTS_PER_REPLICA, description=(
        "requests one replica serves at once (None: its args or its engine's default)"),
        json_schema_extra=Meta(bound="MAX_SLOTS_PER_REPLICA", hash=True))
    autoscale: Autoscale | None = Field(None, description=(
        "how a model with a replica range is scaled (None: it is not)"))
    rollout: Rollout | None = Field(None, description=(
        "{max_surge: 1, max_unavailable: 0, canary_percent: 0}: how a new definition "
        "replaces the running replicas (None: those defaults)"))
    drain_timeout_s: float = Field(120.0, gt=0, le=MAX_DRAIN_TIMEOUT_S, description=(
        "how long a stopping replica may finish its requests in flight before they are cut"),
        json_schema_extra=Meta(bound="MAX_DRAIN_TIMEOUT_S", unit=" of seconds", duration=True))

    @property
    def definition_hash(self) -> str:
        """Changes when source (with its checksum and size), engine, profile or args change
        (a new definition unparks), and so does ``slots`` when set (it is a flag of the
        launch). The strategy, routing and queue are not part of the definition."""
        fields: dict[str, Any] = {}
        for name in HASH_FIELDS:        # the fields marked hash=True, when set
            value = getattr(self, name)
            if value is not None:
                fields[name] = (value.to_dict() if isinstance(value, Frozen)
                                else list(value) if isinstance(value, tuple) else value)
        body = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()


MODEL_FIELDS = tuple(ModelSpec.model_fields)


def extra(cls: type[BaseModel], name: str) -> dict[str, Any]:
    """A field's metadata (the module docstring lists the keys)."""
    meta = cls.model_fields[name].json_schema_extra
    return meta.values if isinstance(meta, Meta) else {}


def default(name: str, cls: type[BaseModel] = ModelSpec) -> Any:
    """The default of a field of ``cls`` (a required field has none: KeyError)."""
    info = cls.model_fields[name]
    if info.is_required():
        raise KeyError(f"{name} is required")
    return info.get_default(call_default_factory=True)


def bounds(name: str, cls: type[BaseModel] = ModelSpec) -> dict[str, Any]:
    """The numeric and length bounds of a field (``ge``, ``gt``, ``le``, ``lt``,
    ``max_length``) as pydantic keeps them."""
    out: dict[str, Any] = {}
    for item in cls.model_fields[name].metadata:
        for key in ("ge", "gt", "le", "lt", "max_length"):
            value = getattr(item, key, None)
            if value is not None:
                out[key] = value
    return out


def catalog_names(cls: type[BaseModel] = ModelSpec) -> tuple[str, ...]:
    """The field names a catalog entry may write (``idle_stop_after``, not its stored
    ``idle_stop_after_s``; ``replicas_max`` is written as ``replicas: {min, max}``)."""
    out = []
    for name, info in cls.model_fields.items():
        meta = extra(cls, name)
        if "catalog" in meta and meta["catalog"] is None:
            continue
        out.append(meta.get("catalog_name", info.alias or name))
    return tuple(out)


# A duration as the catalog may write it (catalog/spec.py parse_duration), beside its number.
DURATION_FORM = {"type": "string", "maxLength": 32, "pattern": DURATION_RE.pattern,
                 "description": "30m, 1h, 90s or 2d"}


def nested_models(cls: type[BaseModel] = ModelSpec) -> dict[str, type[BaseModel]]:
    """The classes of the fields of ``cls`` that are entries of their own (``Profile``,
    ``Autoscale``, ``MaxTokens``), by name, theirs included."""
    out: dict[str, type[BaseModel]] = {}
    for info in cls.model_fields.values():
        for kind in (info.annotation, *typing.get_args(info.annotation)):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                out[kind.__name__] = kind
                out.update(nested_models(kind))
    return out


def _catalog_form(cls: type[BaseModel], schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (pydantic's, of ``cls``) with each field named and typed as the catalog
    writes it: its ``catalog`` form (None: left out), ``catalog_name`` and ``duration``
    metadata applied; its description and default kept."""
    by_alias = {info.alias or name: name for name, info in cls.model_fields.items()}
    props: dict[str, Any] = {}
    for key, prop in schema["properties"].items():
        meta = extra(cls, by_alias[key])
        kept = {k: prop[k] for k in ("description", "default") if k in prop}
        if "catalog" in meta:
            if meta["catalog"] is None:
                continue
            prop = {**meta["catalog"], **kept}
        if meta.get("duration"):
            core = {k: v for k, v in prop.items() if k not in ("description", "default",
                                                                "title")}
            prop = {"anyOf": [*core.pop("anyOf", [core]), dict(DURATION_FORM)], **kept}
        props[meta.get("catalog_name", key)] = prop
    names = {key: extra(cls, name).get("catalog_name", key) for key, name in by_alias.items()}
    out = {**schema, "properties": props}
    if "required" in schema:
        out["required"] = [names[k] for k in schema["required"]]
    return out


def catalog_schema() -> dict[str, Any]:
    """The JSON Schema of one catalog entry as the catalog writes it (the OpenAPI of the
    catalog endpoints): every field of :class:`ModelSpec` and of its nested entries (in
    ``$defs``) with its form in the catalog. Rules across fields (``tp x pp``, a range and
    ``on_demand``, ``max_tokens.default`` at most its ``max``) are catalog/parse.py's."""
    schema = _catalog_form(ModelSpec, ModelSpec.model_json_schema(by_alias=True))
    defs = schema.get("$defs", {})
    for name, cls in nested_models().items():
        defs[name] = _catalog_form(cls, defs[name])
    schema["title"] = "CatalogEntry"
    schema["description"] = ("one model; catalog/parse.py checks every field and "
                             "api/catalog.py defines it (docs/catalog.md)")
    return schema


def to_router(spec: ModelSpec) -> dict[str, Any]:
    """The routes table's per-model part of ``spec``: its :class:`RouteFields`."""
    return {name: getattr(spec, name) for name in RouteFields.model_fields}


ROUTE_FIELDS = tuple(RouteFields.model_fields)
HASH_FIELDS = tuple(n for n in MODEL_FIELDS if extra(ModelSpec, n).get("hash"))
