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
                 ca_file: str | None = None) -> None:
        self.url = url.rstrip("/")
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
            raise ApiError(exc.status, exc.reason, exc.message, exc.details) from None
        except Unreachable as exc:
            raise click.ClickException(
                f"cannot reach the control service at {self.url}: {exc.message}; is "
                "`llmgw server` (or `llmgw up`) running? Set --url or LLMGW_CONTROL_URL"
            ) from None
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


def state_file(name: str) -> Path:
    return default_state_dir() / name
