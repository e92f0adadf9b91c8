"""A small client of the control service's admin API for ``llmgw ctl``."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click
import pydantic

from .. import tls
from ..api.parse import problems
from ..api.transport import RemoteError, Transport, TransportError, Unreachable
from ..control.config import default_state_dir

DEFAULT_URL = "http://127.0.0.1:8470"
URL_FILE = "control-url"          # in the state directory's secrets/, by `llmgw up`


def url_file() -> Path:
    """Where `llmgw up` writes its control service's URL: next to the admin token."""
    return default_state_dir() / "secrets" / URL_FILE


def control_url(explicit: str | None) -> tuple[str, str]:
    """The control service's URL and where it came from: ``--url`` (or
    LLMGW_CONTROL_URL), else the URL a running `llmgw up` wrote in the state directory,
    else the default."""
    if explicit:
        return explicit, ""
    path = url_file()
    if path.is_file():
        written = path.read_text().strip()
        if written:
            return written, f" (read from {path}, written by `llmgw up`)"
    return DEFAULT_URL, ""


class ApiError(click.ClickException):
    def __init__(self, status: int, reason: str, message: str, details: list[str]) -> None:
        text = message + "".join(f"\n  - {d}" for d in details)
        super().__init__(text)
        self.status, self.reason = status, reason

    exit_code = 1


def admin_token(explicit: str | None) -> str:
    if explicit:
        return explicit
    env = os.environ.get("LLMGW_ADMIN_TOKEN")
    if env:
        return env
    path = default_state_dir() / "secrets" / "admin-token"
    if path.is_file():
        return path.read_text().strip()
    raise click.ClickException(
        "no admin token: pass --token, set LLMGW_ADMIN_TOKEN, or run where `llmgw up` "
        f"keeps its state ({path} was not found)")


class Client:
    """``llmgw ctl``'s client of the admin API, over the one transport; answers named
    with ``answer`` are checked against their message before anything is printed."""

    def __init__(self, url: str, token: str, timeout: float = 30.0,
                 ca_file: str | None = None, origin: str = "") -> None:
        self.url = url.rstrip("/")
        self.origin = origin          # where the URL came from, for messages
        self.token = token
        self.transport = Transport(self.url, token, timeout_s=timeout,
                                   ssl_context=tls.client_context(ca_file))

    def request(self, method: str, path: str, body: bytes | None = None,
                content_type: str = "application/json",
                answer: type[pydantic.BaseModel] | None = None) -> Any:
        try:
            _, doc = self.transport.request(method, path, data=body,
                                            content_type=content_type)
        except RemoteError as exc:
            if exc.status == 404 and exc.reason == "http_error":
                raise ApiError(exc.status, exc.reason, not_control(self.url, exc.message),
                               []) from None
            raise ApiError(exc.status, exc.reason, exc.message, exc.details) from None
        except Unreachable as exc:
            raise click.ClickException(
                f"cannot reach the control service at {self.url}{self.origin}: "
                f"{exc.message}; is `llmgw server` (or `llmgw up`) running? Set --url or "
                "LLMGW_CONTROL_URL") from None
        except TransportError as exc:
            raise click.ClickException(str(exc)) from None
        if answer is not None:
            try:
                answer.model_validate(doc)
            except pydantic.ValidationError as exc:
                raise click.ClickException(
                    f"{method} {path}: the control service's answer is malformed (is it "
                    "the same llmgw version?)\n" + "\n".join(f"  - {p}" for p in
                                                             problems(exc))) from None
        return doc

    def get(self, path: str, answer: type[pydantic.BaseModel] | None = None) -> Any:
        return self.request("GET", path, answer=answer)

    def post(self, path: str, payload: Any,
             answer: type[pydantic.BaseModel] | None = None) -> Any:
        if isinstance(payload, pydantic.BaseModel):
            payload = payload.model_dump(mode="json", by_alias=True, exclude_none=True)
        return self.request("POST", path, json.dumps(payload).encode(), answer=answer)

    def delete(self, path: str, answer: type[pydantic.BaseModel] | None = None) -> Any:
        return self.request("DELETE", path, answer=answer)


def not_control(url: str, answer: str) -> str:
    """A 404 that is not JSON: whatever answers at ``url`` is not the control service."""
    return (f"{url} does not serve the admin API ({answer[:200]}): is it the control "
            f"service's URL? `llmgw ctl` talks to the control service (`llmgw server`, port "
            f"8470 by default), not to the router (port 8480); pass --url or set "
            "LLMGW_CONTROL_URL")


def state_file(name: str) -> Path:
    return default_state_dir() / name
