"""Router <-> control: the routes table, the idle map, activation and unreachable replicas."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from ..catalog.bounds import MAX_QUEUE_PER_MODEL as MAX_QUEUE
from ..catalog.bounds import MAX_SLOTS_PER_REPLICA as MAX_SLOTS
from ..catalog.bounds import MAX_WAIT_S
from .catalog import Engine, Rollout, RouteFields, bounds
from .fields import (
    MAX_LIST,
    Answer,
    Bool,
    Count,
    Id,
    Message,
    Name,
    NonNegative,
    SmallCount,
    Text,
)
from .states import Activation, ModelState

MAX_ROUTED_MODELS = 10_000
MAX_KEYS = 100_000
Url = Annotated[str, Field(max_length=300, pattern=r"^https?://[A-Za-z0-9._:\[\]-]+(:\d+)?/?$")]
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Slots = Annotated[int, Field(strict=True, ge=1, le=MAX_SLOTS)]
KeyPriority = Literal["high", "normal", "low"]
ExpiresIn = Annotated[float, Field(allow_inf_nan=False, ge=-1e10, le=1e10)]
# An API key's limits (docs/keys.md): requests and tokens per minute, over all its models.
MAX_RPM = 1_000_000
MAX_TPM = 10_000_000_000
Rpm = Annotated[int, Field(strict=True, ge=1, le=MAX_RPM)]
Tpm = Annotated[int, Field(strict=True, ge=1, le=MAX_TPM)]
# One line of an engine's error in the routes table (a model's reason and last_error) and
# in the router's refusals: the telling line of its log (status/telling.py), at most this
# many characters. The full text stays in `llmgw ctl status -o json` and the engine's log.
ERROR_LINE = 300
# A router that serves requests without a key (IdleMap.keys_optional) posts its idle map
# at least this often, with nothing else to say too, so the control service keeps
# hearing it.
KEYS_OPTIONAL_POST_S = 30.0


class Endpoint(Answer):
    replica_id: Id
    url: Url
    # Requests the replica serves at once (llama.cpp --parallel, vLLM --max-num-seqs, or
    # the catalog's slots); None: unknown, the router does not limit what it sends there.
    slots: Slots | None = None
    # It runs the new version of a canary rollout (RouteModel.canary_percent).
    canary: Bool = False


class RouteModel(RouteFields):
    """One model of the routes table: its catalog settings the routers use (name,
    on_demand, routing, max_queue, max_wait_s, aliases, fallback, max_tokens: defined once
    in api/catalog.py ``RouteFields``), its state and its ready endpoints."""

    model_config = Answer.model_config
    state: Annotated[ModelState, Field(strict=False)]
    reason: Text | None = None
    endpoints: tuple[Endpoint, ...] = Field(default=(), max_length=MAX_LIST, strict=False)
    # The current start streak, for an honest refusal while nothing is ready: failed starts
    # in a row (0: none, or the model is starting for the first time), the last error, and
    # the seconds until the next start may begin (0: it may begin now).
    failures: SmallCount = 0
    last_error: Text | None = None
    retry_after_s: NonNegative | None = None
    # The engine that serves it, named in the router's errors about paths the engine does
    # not serve; None from a control service older than the field.
    engine: Engine | None = None
    # Replicas that finish the requests they have, then stop (docs/operations.md): no new
    # request is sent to them; routers keep counting what they have in flight there and
    # post it (IdleMap.in_flight) until the replica leaves this list.
    draining: tuple[Id, ...] = Field(default=(), max_length=MAX_LIST, strict=False)
    # The share of requests (percent) sent to the endpoints marked ``canary`` while a
    # canary rollout holds; 0: no canary, every endpoint alike.
    canary_percent: Annotated[int, Field(strict=True, ge=0,
                                         le=bounds("canary_percent", Rollout)["le"])] = 0
    # When the model was first applied (Unix seconds, the store's clock): every router
    # answers it as ``created`` in GET /v1/models. None: a control service older than it.
    created: Count | None = None


class KeyLimits(Answer):
    """One API key's limits, for the routers: its name (said in the 429 that refuses it),
    requests per minute and tokens per minute (None: no limit of that kind). Each router
    of N enforces 1/N of each (docs/keys.md)."""

    name: Name
    rpm: Rpm | None = None
    tpm: Tpm | None = None


class Routes(Answer):
    """What routers route: every model's state and its ready endpoints."""

    models: list[RouteModel] = Field(max_length=MAX_ROUTED_MODELS)
    api_key_hashes: list[Sha256Hex] = Field(default_factory=list, max_length=MAX_KEYS)
    # Keys whose requests are not of normal priority (hash -> priority); absent: normal.
    key_priorities: dict[Sha256Hex, KeyPriority] = Field(default_factory=dict,
                                                          max_length=MAX_KEYS)
    # Keys limited to some models (hash -> model names); absent: every model. Another
    # model is answered 404, as if it were not in the catalog.
    key_models: dict[Sha256Hex, Annotated[list[Name], Field(max_length=MAX_LIST)]] = Field(
        default_factory=dict, max_length=MAX_KEYS)
    # Keys that expire: hash -> seconds from when the table was made until the expiry
    # (0 or less: expired), so that no host's wall clock is trusted; the router counts
    # them down on its own clock and refuses a key from then on, between two tables too.
    key_expires_in_s: dict[Sha256Hex, ExpiresIn] = Field(default_factory=dict,
                                                          max_length=MAX_KEYS)
    # Keys with a request or token limit (hash -> limits); absent: no limit.
    key_limits: dict[Sha256Hex, KeyLimits] = Field(default_factory=dict, max_length=MAX_KEYS)


IdleSeconds = Annotated[float, Field(allow_inf_nan=False, ge=0, le=1e9)]


QueueSeconds = Annotated[float, Field(allow_inf_nan=False, ge=0, le=MAX_WAIT_S)]


# The first-byte times routers count per model for the control service's history
# (api/history.py): upper bounds in seconds; a last count is of the times above them.
FIRST_BYTE_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ModelCapacity(Message):
    """One model's load in one router (all its workers), over the interval since this
    worker's last post: what the control service scales on (docs/autoscaling.md) and
    shows as "at capacity"."""

    waiting: Annotated[int, Field(strict=True, ge=0, le=MAX_QUEUE)]     # at the post
    in_flight: SmallCount                                                # at the post
    slots: SmallCount                                                    # this router's
    rejected: SmallCount                                                 # in the interval
    wait_p90_s: QueueSeconds = 0.0       # of the requests that stopped waiting in it
    # The most slots this router's requests held at once in the interval (at least
    # in_flight); how long the oldest request still waiting has waited, at the post;
    # requests that had to wait in the interval. Absent from a router older than them.
    busy: SmallCount = 0
    oldest_wait_s: QueueSeconds = 0.0
    queued: SmallCount = 0
    # Whether every slot was taken with requests waiting or refused in the interval; a
    # router older than the field posted only such models.
    at_capacity: Bool = True
    # Requests whose first byte came in the interval, counted per FIRST_BYTE_BUCKETS_S
    # bucket (len + 1 counts, the last above them); empty: none, or an older router.
    first_byte: list[SmallCount] = Field(default_factory=list,
                                         max_length=len(FIRST_BYTE_BUCKETS_S) + 1)


class VersionCounts(Message):
    """Requests one router worker sent to one version of a model since its last post."""

    requests: SmallCount = 0
    errors: SmallCount = 0          # answered 5xx, or cut, by the engine or on the way
    tokens: Annotated[int, Field(strict=True, ge=0, le=10**12)] = 0
    first_byte_s: Annotated[float, Field(allow_inf_nan=False, ge=0, le=1e7)] = 0.0  # summed
    answered: SmallCount = 0        # requests whose first byte came (first_byte_s's count)


class ModelVersions(Message):
    """A canary rollout's two versions as one router worker saw them since its last post."""

    stable: VersionCounts = Field(default_factory=VersionCounts)
    canary: VersionCounts = Field(default_factory=VersionCounts)


class IdleMap(Message):
    """How long ago this router last used each replica (seconds, by its own monotonic
    clock; the control service turns them into times with the store's clock, so a router
    host's wall clock never decides idleness). A replica the router never used is absent:
    unknown, never zero."""

    replicas: dict[Id, IdleSeconds] = Field(max_length=MAX_LIST * 4)
    # The load of each model this router served since its last post or holds requests
    # of (a router older than at_capacity posted only models at capacity); absent: none.
    capacity: dict[Name, ModelCapacity] = Field(default_factory=dict, max_length=MAX_LIST)
    # Which router posts (the same for all its workers, new at each start): the control
    # service sums the load over routers and not over one router's workers. None: a
    # router older than the field.
    router: Id | None = None
    # Which worker of that router posts (its process), and the requests this worker has
    # in flight on each replica (absent: none): the control service stops a draining
    # replica once every router worker says none are left. None: a router older than it.
    worker: Id | None = None
    in_flight: dict[Id, SmallCount] = Field(default_factory=dict, max_length=MAX_LIST * 4)
    # Canary rollouts: each model's requests by version since this worker's last post.
    versions: dict[Name, ModelVersions] = Field(default_factory=dict, max_length=MAX_LIST)
    # True: this router serves requests that carry no API key (started with
    # --no-require-api-key, as `llmgw up` does unless --require-api-key); a key that is
    # sent is still checked. The control service says so when a key is created.
    keys_optional: Bool = False


class Unreachable(Message):
    """A router could not connect to this replica (refused or reset before the first
    byte): the control service stops routing to it until its agent reports it ready."""

    replica_id: Id
    reason: Text


class ActivateRequest(Message):
    model: Name


class ActivateAnswer(Answer):
    model: Name
    state: Annotated[Activation, Field(strict=False)]
    reason: Text | None = None
    # As in RouteModel: a model whose current start streak failed is not activated again
    # before its backoff; the router refuses the request at once with these.
    failures: SmallCount = 0
    last_error: Text | None = None
    retry_after_s: NonNegative | None = None


# The router's own API (OpenAI-compatible); its document is generated from these.

class ProxyRequest(Message):
    """An OpenAI request body: ``model`` (and ``stream``) are read, the rest is forwarded
    to the engine unchanged."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    model: Name
    stream: Bool | None = None


class ModelEntry(Answer):
    id: Name
    object: Literal["model"]
    created: Annotated[int, Field(ge=0, description="when the model was first applied to "
                                  "the catalog (Unix seconds), the same on every router")]
    owned_by: Literal["llmgw"]


class ModelsList(Answer):
    object: Literal["list"]
    data: list[ModelEntry]


class RouterHealth(Answer):
    status: Literal["ok", "routes_unavailable"]
    models: Annotated[int, Field(ge=0)]
    message: str | None = None


class OpenAIErrorBody(Answer):
    message: str = Field(description="what is wrong and what to do")
    type: str
    code: str
    param: str | None


class OpenAIError(Answer):
    error: OpenAIErrorBody
