"""Router errors, answered in OpenAI's shape ``{"error": {"message","type","code","param"}}``."""

from __future__ import annotations

from typing import Any

from ..errors import LlmgwError


class RouterError(LlmgwError):
    """An error the router answers to an OpenAI client. ``code`` is OpenAI's ``error.code``."""

    status = 500
    code = "internal_error"
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type_: str, code: str, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "code": code, "param": param}}


class InvalidJson(RouterError):
    status, code, type = 400, "invalid_json", "invalid_request_error"


class InvalidRequest(RouterError):
    status, code, type = 400, "invalid_request", "invalid_request_error"


class RequestTooLarge(RouterError):
    status, code, type = 413, "request_too_large", "invalid_request_error"


class InvalidApiKey(RouterError):
    status, code, type = 401, "invalid_api_key", "invalid_request_error"


class TooManyFailedKeys(RouterError):
    """Repeated wrong API keys from one address: refused for ``retry_after_s`` (the
    Retry-After header) before its key is even checked."""

    status, code, type = 429, "too_many_failed_keys", "invalid_request_error"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ModelNotFound(RouterError):
    status, code, type = 404, "model_not_found", "invalid_request_error"


class PathNotServed(RouterError):
    """A passed-through path (``/v1/responses``, ``/v1/messages``) the model's engine does
    not serve (it answered 404): the message names the engine and the paths that work."""

    status, code, type = 404, "unsupported_endpoint", "invalid_request_error"


class NotControlService(RouterError):
    """An admin API path (``/api/...``) asked of the router: ``llmgw ctl`` pointed at
    the router's URL. The message names the control service's URL."""

    status, code, type = 404, "not_the_control_service", "invalid_request_error"


class ModelParked(RouterError):
    status, code = 503, "model_parked"


class ModelUnplaceable(RouterError):
    status, code = 503, "model_unplaceable"


class ModelStopped(RouterError):
    status, code = 503, "model_stopped"


class ModelNotReady(RouterError):
    status, code = 503, "model_not_ready"


class UpstreamError(RouterError):
    status, code = 502, "upstream_error"


class ReplicasUnreachable(UpstreamError):
    """No endpoint of the model could be connected to: nothing reached an engine, so the
    router waits for the control service's view once before answering (a 502 when it
    still has nothing better)."""


class ModelFailing(RouterError):
    """No ready replica and the model's current start streak has failed: refused at once
    with the last error, the attempts so far and ``retry_after_s`` (the Retry-After
    header: when the next start may begin)."""

    status, code = 503, "model_failing"

    def __init__(self, message: str, *, retry_after_s: float, param: str | None = None
                 ) -> None:
        super().__init__(message, param=param)
        self.retry_after_s = retry_after_s


class ModelAtCapacity(RouterError):
    """Every slot of the model's replicas is taken and its queue in this router is full
    (``max_queue``) or the request waited ``max_wait_s``: OpenAI's rate-limit shape (429),
    with ``retry_after_s`` (the Retry-After header) when a slot is likely free."""

    status, code, type = 429, "model_at_capacity", "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message, param="model")
        self.retry_after_s = retry_after_s


class KeyRateLimited(RouterError):
    """An API key over its requests or tokens per minute (docs/keys.md): OpenAI's 429
    (``type`` "requests" or "tokens", as OpenAI names the limit), with ``retry_after_s``
    (the Retry-After header: when the key has room for one request again)."""

    status, code = 429, "rate_limit_exceeded"

    def __init__(self, message: str, *, kind: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.type = kind
        self.retry_after_s = retry_after_s


class ClientGone(RouterError):
    """The client closed its connection while its request waited for a slot: nobody reads
    this answer (499, nginx's "client closed request"), it only ends the request."""

    status, code, type = 499, "client_closed_request", "invalid_request_error"
