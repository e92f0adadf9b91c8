"""Router <-> control: the routes table, the idle map, activation and unreachable replicas."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from .fields import (
    MAX_LIST,
    Answer,
    Bool,
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


class Endpoint(Answer):
    replica_id: Id
    url: Url


class RouteModel(Answer):
    name: Name
    state: Annotated[ModelState, Field(strict=False)]
    reason: Text | None = None
    on_demand: Bool = False
    endpoints: list[Endpoint] = Field(default_factory=list, max_length=MAX_LIST)
    # The current start streak, for an honest refusal while nothing is ready: failed starts
    # in a row (0: none, or the model is starting for the first time), the last error, and
    # the seconds until the next start may begin (0: it may begin now).
    failures: SmallCount = 0
    last_error: Text | None = None
    retry_after_s: NonNegative | None = None


class Routes(Answer):
    """What routers route: every model's state and its ready endpoints."""

    models: list[RouteModel] = Field(max_length=MAX_ROUTED_MODELS)
    api_key_hashes: list[Sha256Hex] = Field(default_factory=list, max_length=MAX_KEYS)


IdleSeconds = Annotated[float, Field(allow_inf_nan=False, ge=0, le=1e9)]


class IdleMap(Message):
    """How long ago this router last used each replica (seconds, by its own monotonic
    clock; the control service turns them into times with the store's clock, so a router
    host's wall clock never decides idleness). A replica the router never used is absent:
    unknown, never zero."""

    replicas: dict[Id, IdleSeconds] = Field(max_length=MAX_LIST * 4)


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
    created: Annotated[int, Field(ge=0, description="when this router first saw the model")]
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
