"""Admin API bodies and answers (``llmgw ctl``, the console's JSON twin)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidatorFunctionWrapHandler, WrapValidator, model_validator

from .agent import CardReport, DeviceReport
from .catalog import Autoscale, ModelSpec
from .fields import (
    MAX_LIST,
    Answer,
    Bool,
    Count,
    Finite,
    Line,
    Message,
    Name,
    Pid,
    Port,
    SmallCount,
    Text,
)
from .router import KeyPriority, Rpm, Tpm
from .states import ModelState, ReplicaState

MAX_KEY_NAME = 100
KEY_NAME_SAYS = (f"a key name has 1-{MAX_KEY_NAME} letters, digits, '.', '_', '@', '+' or "
                 "'-', and starts with a letter or digit (no spaces)")


def _key_name(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A key name, or an error that says which characters a name may have."""
    try:
        return handler(value)
    except ValueError:
        raise ValueError(KEY_NAME_SAYS) from None


KeyName = Annotated[str, Field(strict=True, min_length=1, max_length=MAX_KEY_NAME,
                               pattern=r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$"),
                    WrapValidator(_key_name)]


def _known_priority(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A priority, or an error that names the allowed ones."""
    try:
        return handler(value)
    except ValueError:
        raise ValueError("unknown; use high, normal (the default) or low") from None


# An API key's priority in a model's queue (api/router.py ``KeyPriority``): a router serves
# waiting requests of high keys first, then normal, then low, fairly across the keys of each
# (docs/routing.md). As a request gives it: an unknown one names the allowed ones.
Priority = Annotated[KeyPriority, WrapValidator(_known_priority)]


# How long a key lives at most when it expires: ten years (``--expires 3650d``).
MAX_KEY_LIFETIME_S = 10 * 365 * 86400
KEY_LIFETIME_SAYS = (f"a key's lifetime is a number of seconds above 0 and at most "
                     f"{MAX_KEY_LIFETIME_S} ({MAX_KEY_LIFETIME_S // 86400} days)")


def _key_lifetime(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A key's lifetime in seconds, or an error that names its bounds in days too."""
    try:
        return handler(value)
    except ValueError:
        raise ValueError(KEY_LIFETIME_SAYS) from None


KeyLifetime = Annotated[float, Field(allow_inf_nan=False, gt=0, le=MAX_KEY_LIFETIME_S),
                        WrapValidator(_key_lifetime)]
# The models a key may use: catalog names (None: every model). A model that is not (yet)
# in the catalog may be named: the scope holds until it is.
KeyModels = Annotated[list[Name], Field(min_length=1, max_length=MAX_LIST)]


class KeyCreate(Message):
    name: KeyName
    priority: Priority = "normal"
    models: KeyModels | None = None
    expires_in_s: KeyLifetime | None = None
    # Limits (docs/keys.md): requests and tokens per minute over all its models; None: none.
    rpm: Rpm | None = None
    tpm: Tpm | None = None


class KeyCreated(Answer):
    name: str
    key: str
    priority: KeyPriority = "normal"
    models: list[str] | None = None
    expires_at: Finite | None = None
    rpm: Rpm | None = None
    tpm: Tpm | None = None
    # Set when a router heard from lately serves requests without any key, so this key's
    # limits and scope bind only clients that send it; says how to require keys.
    note: Text | None = None


class KeyUpdate(Message):
    """``PATCH /api/v1/keys/<name>``: what changes (the key itself never does); at least
    one field. ``models: "all"`` lifts a scope, ``expires_in_s: "never"`` an expiry,
    ``rpm``/``tpm: "none"`` a limit."""

    priority: Priority | None = None
    models: KeyModels | Literal["all"] | None = None
    expires_in_s: KeyLifetime | Literal["never"] | None = None
    rpm: Rpm | Literal["none"] | None = None
    tpm: Tpm | Literal["none"] | None = None

    @model_validator(mode="after")
    def _changes_something(self) -> KeyUpdate:
        if (self.priority is None and self.models is None and self.expires_in_s is None
                and self.rpm is None and self.tpm is None):
            raise ValueError("nothing to change: give priority, models (a list, or \"all\"), "
                             "expires_in_s (seconds, or \"never\"), rpm or tpm (a number "
                             "per minute, or \"none\")")
        return self


class KeyInfo(Answer):
    name: str
    created: Finite
    priority: KeyPriority = "normal"
    models: list[str] | None = None
    expires_at: Finite | None = None
    expired: Bool = False
    rpm: Rpm | None = None
    tpm: Tpm | None = None


class Keys(Answer):
    keys: list[KeyInfo]


class Deleted(Answer):
    deleted: str


class ScaleSignal(Answer):
    """What the routers reported of a scaled model, summed over routers."""

    waiting: Count
    busy: Count
    slots: Count | None = None
    wait_s: Finite
    rejected: Count
    routers: Count


class Scaling(Answer):
    """A scaled model's current / target / min / max replicas and why (autoscale.view)."""

    current: SmallCount
    target: SmallCount
    min: SmallCount
    max: SmallCount
    signal: ScaleSignal
    settings: Autoscale
    up_for_s: Finite | None = None
    down_for_s: Finite | None = None
    blocked: Text | None = None
    note: Text


class Model(ModelSpec, Answer):
    """A model as the admin API shows it: its catalog entry (every field of api/catalog.py's
    ``ModelSpec``, defaults filled in, and its ``definition_hash`` as stored) and the fleet's
    state of it."""

    model_config = Answer.model_config
    # The hash stored with the entry (the property ``definition_hash`` computes it from
    # the fields; a stored one was computed alike when the entry was written).
    stored_hash: Annotated[str, Field(alias="definition_hash", max_length=64)]
    parked: Bool
    consecutive_failures: SmallCount
    last_error: str | None = None
    last_failure_at: Finite | None = None
    activated_at: Finite | None = None
    placement_reason: str | None = None
    created: Finite
    updated: Finite
    capacity_at: Finite | None = None
    # The routers' last report of it at capacity (control/capacity.py), as stored.
    capacity: dict[str, Any] | None = None
    state: Annotated[ModelState, Field(strict=False)]
    reason: str | None = None
    ready: SmallCount
    wanted: SmallCount
    scale_target: SmallCount | None = None
    scaling: Scaling | None = None               # None: a fixed number of replicas


class Hardware(Answer):
    source: str | None = None
    driver_version: str | None = None
    cards: list[CardReport] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list)


class Node(Answer):
    """A node as its last report left it. Its devices and hardware are shown as stored: a
    row written before reports were parsed strictly may hold what the planner cannot use
    (``problem`` says so), shown as it is rather than not at all."""

    name: str
    fabric: str | None = None
    address: str | None = None
    last_report: Finite | None = None
    agent_version: str | None = None
    devices: list[DeviceReport] | list[dict[str, Any]] = Field(union_mode="left_to_right")
    engines: list[str]
    weights: dict[str, Any]
    hardware: Hardware | dict[str, Any] = Field(union_mode="left_to_right")
    problem: Text | None = None
    # Cordoned: no new replica is placed on it; draining: its replicas move elsewhere
    # (``ctl nodes cordon``/``drain``, docs/operations.md).
    cordoned: Bool = False
    draining: Bool = False


class Part(Answer):
    rank: SmallCount
    node: str
    devices: list[SmallCount]
    state: str
    pid: Pid | None = None
    last_error: str | None = None


class ReplicaProgress(Answer):
    bytes: Finite
    total: Finite | None = None
    rate_bps: Finite = 0.0


class ReplicaDrain(Answer):
    """A replica that finishes its requests in flight, then stops: why, how many the
    routers last said were in flight, and the seconds left before what is left is cut."""

    reason: Text
    in_flight: Count = 0
    left_s: Finite = 0.0
    since: Finite


class Replica(Answer):
    id: str
    model: str
    node: str
    devices: list[SmallCount]
    port: Port | None = None
    pid: Pid | None = None
    state: Annotated[ReplicaState, Field(strict=False)]
    desired: Bool
    started: Finite
    updated: Finite
    last_used: Finite | None = None
    last_error: str | None = None
    rendezvous_port: Port | None = None
    progress: ReplicaProgress | None = None
    parts: list[Part] = Field(default_factory=list)
    # Set while it finishes its requests before it stops (no new ones are sent to it).
    draining: ReplicaDrain | None = None
    # Whether it runs the model's current definition (False: an old one, being rolled).
    current: Bool = True


class Event(Answer):
    id: Count
    time: Finite
    kind: str
    subject: str
    message: str


class FieldChange(Answer):
    """A field of a model's entry that an apply changes: its value before and after, as
    the catalog writes it (``none``: unset), a long one shortened with ``…``; a mapping's
    key is named in it (``profile.class``)."""

    field: Line
    old: Text
    new: Text


class ModelChange(Answer):
    """What an apply changes in a model that exists: its changed fields, and the running
    replicas that its new definition replaces (one at a time, without dropping requests:
    docs/operations.md)."""

    fields: list[FieldChange] = Field(default_factory=list)
    replaces: list[str] = Field(default_factory=list)


class CatalogResult(Answer):
    """What applying a catalog changed, or with ``dry_run`` would change (nothing was
    written). ``kept``: models in the store that the catalog does not name, kept because
    the apply did not prune (``?prune=true`` deletes them)."""

    created: list[str]
    updated: list[str]
    unchanged: list[str]
    deleted: list[str]
    kept: list[str] = Field(default_factory=list)
    # Models whose new definition rolls their running replicas (docs/operations.md).
    rolls: list[str] = Field(default_factory=list)
    # Per updated model: the fields that change and the replicas that are replaced.
    changes: dict[str, ModelChange] = Field(default_factory=dict)
    dry_run: Bool = False
    # A digest of ``deleted``: given back as ``?deletes=``, the apply deletes exactly these
    # or nothing (409), so a prune deletes what ``ctl`` showed and was confirmed.
    deletes: Text | None = None


class PlanPart(Answer):
    rank: SmallCount
    node: str
    devices: list[SmallCount]


class PlanStart(Answer):
    """A replica placement would start: where, on which devices, and why there."""

    model: str
    node: str
    devices: list[SmallCount]
    parts: list[PlanPart] = Field(default_factory=list)
    why: str


class PlanStop(Answer):
    """A replica placement would stop (its model and node when it is still known)."""

    replica: str
    model: str | None = None
    node: str | None = None
    why: str


class Plan(Answer):
    """What placement would do now, without doing it, and why (``ctl plan``); the devices,
    idle cards, fabrics and weights by model are the status summary's parts
    (status/status.schema.json)."""

    starts: list[PlanStart]
    stops: list[PlanStop]
    unplaceable: dict[str, str | None]
    devices: dict[str, Any] = Field(default_factory=dict)
    cards_unusable: list[Any] = Field(default_factory=list)
    fabrics: dict[str, Any] = Field(default_factory=dict)
    models: dict[str, Any] = Field(default_factory=dict)


class Retried(Answer):
    """``parked`` is the model's state now (false); ``was_parked`` says whether the retry
    unparked it, or it was not parked and only its failure count was reset."""

    model: str
    parked: Bool
    was_parked: Bool


class NodeReset(Answer):
    """The node's credential is gone (``credential`` is always null): its host joins again
    with the join token."""

    node: str
    credential: None


class NodeDeleted(Answer):
    """The node deleted, and the replicas that used it (placed again elsewhere)."""

    deleted: str
    replicas: list[str] = Field(default_factory=list)


class Health(Answer):
    status: Literal["ok", "store_unavailable"]
    leader: str | None = None
    version: str
    message: str | None = None


class ModelList(Answer):
    models: list[Model] = Field(max_length=MAX_LIST * 4)


class NodeList(Answer):
    nodes: list[Node]


class ReplicaList(Answer):
    replicas: list[Replica]


class EventList(Answer):
    events: list[Event]


class ErrorBody(Answer):
    code: int
    reason: str
    message: str
    details: list[str] = Field(default_factory=list)


class Error(Answer):
    error: ErrorBody


# ------------------------------------------------------------------ rollouts and drains


class VersionTally(Answer):
    """Requests to one version of a model during its rollout, as the routers counted them."""

    requests: Count = 0
    errors: Count = 0
    tokens: Count = 0
    first_byte_s: Finite | None = None           # the mean, None before any answer


class RolloutStatus(Answer):
    """A model's rollout (``ctl rollout status``, docs/operations.md): ``state`` none (every
    replica runs the current definition), rolling, canary (the new version holds
    ``canary_percent`` of the requests until promoted), failed (the new version did not
    start: the old replicas keep serving) or paused-for-room (nothing can start)."""

    model: str
    state: Literal["none", "rolling", "canary", "failed"]
    definition: Text                             # the current definition hash (12 chars)
    previous: Text | None = None                 # the one `ctl rollout undo` goes back to
    wanted: SmallCount = 0
    old_ready: SmallCount = 0
    old_total: SmallCount = 0
    new_ready: SmallCount = 0
    new_total: SmallCount = 0
    draining: SmallCount = 0
    max_surge: SmallCount = 1
    max_unavailable: SmallCount = 0
    canary_percent: SmallCount = 0
    waiting_for: Text | None = None
    since: Finite | None = None
    for_s: Finite | None = None
    error: Text | None = None
    versions: dict[str, VersionTally] = Field(default_factory=dict)   # "stable", "canary"


class DrainRequest(Message):
    """``POST /api/v1/nodes/NAME/drain``: ``force`` drains replicas that have nowhere to
    go (their models lose capacity until there is room)."""

    force: Bool = False


class NodeDrain(Answer):
    """A node's cordon and drain: what moved, what it waits for, and (refused without
    ``force``) which models would lose capacity."""

    node: str
    cordoned: Bool
    draining: Bool
    done: Bool = False
    moved: SmallCount = 0
    total: SmallCount = 0
    waiting_for: Text | None = None
    lose_capacity: list[str] = Field(default_factory=list)
    since: Finite | None = None
