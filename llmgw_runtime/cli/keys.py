"""``llmgw ctl keys``: router API keys: create, list, change, delete.

A key may be limited to some models (``--models a,b``: other models answer 404 as if
absent), may expire (``--expires 30d``) and may have limits (``--rpm N``, ``--tpm N``:
requests and tokens per minute, 429 beyond them); all can be changed later (``keys set``),
and none changes the key itself. docs/keys.md.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click

from ..catalog.spec import parse_duration
from ..status.tables import largest_unit
from ..text import printable
from .common import client, part, request_body, say, show
from .lazy import lazy
from .output import ago, output_option

messages = lazy("llmgw_runtime.api.admin")   # loaded when a command uses it

PRIORITY = click.Choice(("high", "normal", "low"))
PRIORITY_HELP = ("its requests' turn in a model's queue when every slot is busy: high keys' "
                 "first, low keys' last; fair among the keys of one priority")
MODELS_HELP = ("the models it may use, comma-separated (others answer 404 as if absent); "
               "default: every model")
EXPIRES_HELP = "how long it works, like 30d, 12h or 90m (default: until deleted)"
RPM_HELP = "requests per minute it may send, over all its models (default: no limit)"
TPM_HELP = ("tokens per minute (prompt + completion) its requests may use, over all its "
            "models (default: no limit)")
# The options of each field of KeyCreate and KeyUpdate, to name them when one is refused.
OPTIONS = {"name": "NAME", "priority": "--priority", "models": "--models",
           "expires_in_s": "--expires", "rpm": "--rpm", "tpm": "--tpm"}


@click.group()
def keys() -> None:
    """Router API keys (stored hashed; a key is shown only when created)."""


def _models(value: str) -> list[str]:
    """``a,b`` as names (how many, and which, the message says)."""
    return [n.strip() for n in value.split(",") if n.strip()]


def _limit(value: str, flag: str, lift: bool = False) -> int | str:
    """A per-minute limit as typed: a whole number (its bounds are the message's), or
    ``none``, which lifts it in ``keys set``."""
    text = value.strip()
    if lift and text == "none":
        return "none"
    try:
        return int(text)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a whole number"
                                 + (" (or none)" if lift else ""), param_hint=[flag]) from None


def limits_text(key: dict[str, Any]) -> tuple[str, str]:
    """The RPM and TPM columns of ``keys list``: the number, or ``-`` for none."""
    rpm, tpm = key.get("rpm"), key.get("tpm")
    return ("-" if rpm is None else str(rpm), "-" if tpm is None else str(tpm))


def _lifetime(value: str, never: bool = False) -> float:
    """``--expires`` as seconds: a number of days, hours or minutes (``30d``), within a
    key's longest lifetime; the message names the forms (and ``never`` in ``keys set``)."""
    longest = messages.MAX_KEY_LIFETIME_S // 86400
    forms = (f"a number of days, hours or minutes like 30d, 12h or 90m (at most {longest}d)"
             + (", or never" if never else ""))
    try:
        seconds = parse_duration(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a lifetime; write {forms}",
                                 param_hint=["--expires"]) from None
    if seconds > messages.MAX_KEY_LIFETIME_S:
        raise click.BadParameter(f"{value!r} is longer than a key may live; write {forms}",
                                 param_hint=["--expires"])
    return seconds


def expiry_text(key: dict[str, Any], now: float | None = None) -> str:
    """"never", "in 29 d", "expired 2 h ago"."""
    expires_at = key.get("expires_at")
    if expires_at is None:
        return "never"
    left = expires_at - (time.time() if now is None else now)
    if key.get("expired") or left <= 0:
        return f"expired {ago(expires_at, now)}"
    return f"in {largest_unit(left)}"


@keys.command("create")
@click.argument("name")
@click.option("--priority", type=PRIORITY, default="normal", show_default=True,
              help=PRIORITY_HELP)
@click.option("--models", "models", metavar="A,B", help=MODELS_HELP)
@click.option("--expires", metavar="DURATION", help=EXPIRES_HELP)
@click.option("--rpm", metavar="N", help=RPM_HELP)
@click.option("--tpm", metavar="N", help=TPM_HELP)
@click.pass_context
def keys_create(ctx: click.Context, name: str, priority: str, models: str | None,
                expires: str | None, rpm: str | None, tpm: str | None) -> None:
    """Create API key NAME; the key is shown once."""
    fields: dict[str, Any] = {"name": name}
    if priority != "normal":        # a control service older than priorities still works
        fields["priority"] = priority
    if models is not None:
        fields["models"] = _models(models)
    if expires is not None:
        fields["expires_in_s"] = _lifetime(expires)
    if rpm is not None:
        fields["rpm"] = _limit(rpm, "--rpm")
    if tpm is not None:
        fields["tpm"] = _limit(tpm, "--tpm")
    body = request_body(messages.KeyCreate, OPTIONS, **fields)
    result = client(ctx).post("/api/v1/keys", body.to_json(), answer=messages.KeyCreated)
    limits = []
    if result.get("priority", "normal") != "normal":
        limits.append(f"{result['priority']} priority")
    if result.get("models") is not None:
        limits.append("models " + ", ".join(result["models"]))
    if result.get("expires_at") is not None:
        limits.append("expires " + expiry_text(result))
    for kind in ("rpm", "tpm"):
        if result.get(kind) is not None:
            limits.append(f"{result[kind]} {'requests' if kind == 'rpm' else 'tokens'}/min")
    if result.get("note"):          # routers that serve without keys: on stderr, first
        click.echo("note: " + printable(result["note"]), err=True)
    say(f"API key {result['name']}" + (f" ({'; '.join(limits)})" if limits else "")
        + " (shown once; store it now):")
    say(result["key"])


@keys.command("list")
@output_option
@click.pass_context
def keys_list(ctx: click.Context, fmt: str) -> None:
    """API keys with their priority, models, expiry, limits (requests and tokens per
    minute, - for none) and age (never the keys: only their hashes are kept)."""
    data = client(ctx).get("/api/v1/keys", answer=messages.Keys)
    show(data, [(k["name"], k.get("priority", "normal"),
                 "all" if k.get("models") is None else ", ".join(k["models"]),
                 expiry_text(k), *limits_text(k), ago(k["created"]))
                for k in data["keys"]],
         ("NAME", "PRIORITY", "MODELS", "EXPIRES", "RPM", "TPM", "CREATED"), fmt)


@keys.command("set")
@click.argument("name")
@click.option("--priority", type=PRIORITY, help=PRIORITY_HELP)
@click.option("--models", "models", metavar="A,B|all",
              help="the models it may use, comma-separated, or all")
@click.option("--expires", metavar="DURATION|never",
              help="how long from now it works (30d, 12h), or never")
@click.option("--rpm", metavar="N|none", help="requests per minute, or none")
@click.option("--tpm", metavar="N|none", help="tokens per minute, or none")
@click.pass_context
def keys_set(ctx: click.Context, name: str, priority: str | None, models: str | None,
             expires: str | None, rpm: str | None, tpm: str | None) -> None:
    """Change API key NAME's priority, models, expiry or limits (the key itself stays);
    routers use it from their next routes refresh."""
    fields: dict[str, Any] = {}
    if priority is not None:
        fields["priority"] = priority
    if models is not None:
        fields["models"] = "all" if models.strip() == "all" else _models(models)
    if expires is not None:
        fields["expires_in_s"] = "never" if expires.strip() == "never" else _lifetime(
            expires, never=True)
    if rpm is not None:
        fields["rpm"] = _limit(rpm, "--rpm", lift=True)
    if tpm is not None:
        fields["tpm"] = _limit(tpm, "--tpm", lift=True)
    if not fields:
        raise click.UsageError("say what to change: --priority, --models, --expires, --rpm "
                               "or --tpm")
    body = request_body(messages.KeyUpdate, OPTIONS, **fields)
    key = client(ctx).request("PATCH", f"/api/v1/keys/{part(name)}",
                              json.dumps(body.to_json()).encode(), answer=messages.KeyInfo)
    now = []
    if priority is not None:
        now.append(f"priority {key.get('priority', priority)}")
    if models is not None:
        now.append("models " + ("all" if key.get("models") is None
                                else ", ".join(key["models"])))
    if expires is not None:
        now.append("expires " + expiry_text(key))
    for kind, given in (("rpm", rpm), ("tpm", tpm)):
        if given is not None:
            now.append(f"{kind} " + ("none" if key.get(kind) is None else str(key[kind])))
    say(f"API key {name}: {'; '.join(now)}; routers use it from their next routes refresh")


@keys.command("delete")
@click.argument("name")
@click.pass_context
def keys_delete(ctx: click.Context, name: str) -> None:
    """Delete API key NAME: routers refuse it from their next routes refresh (about a
    second: LLMGW_REFRESH_INTERVAL_S)."""
    client(ctx).request("DELETE", f"/api/v1/keys/{part(name)}")
    say(f"API key {name} deleted; routers refuse it from their next routes refresh")
