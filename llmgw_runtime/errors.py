"""The one exception tree of llmgw.

Every error a user can meet derives from :class:`LlmgwError`. Messages name what is wrong
and what to do about it; ``reason`` is a short machine-readable word used in API errors.
"""

from __future__ import annotations


class LlmgwError(Exception):
    """Base of every llmgw error. ``status`` is the HTTP status an API answers with."""

    status = 500
    reason = "internal_error"

    def __init__(self, message: str, *, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = list(details or [])

    def __str__(self) -> str:
        if not self.details:
            return self.message
        return self.message + "\n" + "\n".join(f"  - {d}" for d in self.details)


class ConfigError(LlmgwError):
    """The configuration is invalid; ``details`` lists every problem at once."""

    reason = "invalid_config"


class ValidationError(LlmgwError):
    """A request or a catalog is invalid; ``details`` lists every problem at once."""

    status = 400
    reason = "invalid_request"


class CatalogError(ValidationError):
    reason = "invalid_catalog"


class AuthError(LlmgwError):
    status = 401
    reason = "unauthorized"


class ForbiddenError(LlmgwError):
    status = 403
    reason = "forbidden"


class NotFoundError(LlmgwError):
    status = 404
    reason = "not_found"


class ConflictError(LlmgwError):
    status = 409
    reason = "conflict"


class StoreError(LlmgwError):
    status = 503
    reason = "store_unavailable"


class EngineError(LlmgwError):
    """An engine could not be prepared or started (bad path, unknown engine, no binary)."""

    reason = "engine_error"


class DeviceError(LlmgwError):
    reason = "device_error"
