"""A small client of the control service's admin API for ``llmgw ctl``."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import click

from .. import tls
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
    def __init__(self, url: str, token: str, timeout: float = 30.0,
                 ca_file: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.context = tls.client_context(ca_file)

    def request(self, method: str, path: str, body: bytes | None = None,
                content_type: str = "application/json") -> Any:
        req = urllib.request.Request(self.url + path, data=body, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        if body is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout,
                                        context=self.context) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                err = json.loads(raw)["error"]
                raise ApiError(exc.code, err.get("reason", ""), err.get("message", ""),
                               err.get("details") or []) from None
            except (ValueError, KeyError, TypeError):
                raise ApiError(exc.code, "http_error", f"HTTP {exc.code} from {self.url}",
                               []) from None
        except urllib.error.URLError as exc:
            raise click.ClickException(
                f"cannot reach the control service at {self.url}: {exc.reason}; is "
                "`llmgw server` (or `llmgw up`) running? Set --url or LLMGW_CONTROL_URL"
            ) from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, payload: Any) -> Any:
        return self.request("POST", path, json.dumps(payload).encode())


def state_file(name: str) -> Path:
    return default_state_dir() / name
