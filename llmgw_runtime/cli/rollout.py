"""``llmgw ctl rollout``: a model's rollout (its replicas replaced by a new definition,
or a canary of it beside the old ones): where it stands, promote a canary, undo it
(docs/operations.md)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import click

from ..status.tables import duration, table
from .common import client, ctrl_c_ends, part, say
from .lazy import lazy
from .output import output_option, terminal_width

messages = lazy("llmgw_runtime.api.admin")   # loaded when a command uses it

POLL_S = 2.0          # how often --watch asks


@click.group()
def rollout() -> None:
    """A model's rollout: ``status MODEL [--watch]``, ``promote MODEL`` (a canary
    replaces every old replica), ``undo MODEL`` (back to the previous definition)."""


@rollout.command("status")
@click.argument("model")
@click.option("-w", "--watch", is_flag=True,
              help=f"ask again every {POLL_S:g} s, printing what changed, until the rollout "
                   "is done (exit 0) or failed (exit 1)")
@output_option
@click.pass_context
def rollout_status(ctx: click.Context, model: str, watch: bool, fmt: str) -> None:
    """MODEL's rollout: old and new replicas ready, what it waits for and for how long,
    the error of a failed one, and a canary's requests, errors, first-byte time and
    tokens per version."""
    api = client(ctx)
    path = f"/api/v1/models/{part(model)}/rollout"
    doc = api.get(path, answer=messages.RolloutStatus)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        for line in status_lines(doc, terminal_width()):
            say(line)
    if not watch:
        return
    ctrl_c_ends()
    end = follow(lambda: api.get(path, answer=messages.RolloutStatus), doc)
    if end["state"] == "failed":
        raise click.ClickException(f"rollout of {model} failed: {end.get('error') or '?'}; "
                                   "the old replicas keep serving. " + undo_hint(model))
    say(f"rollout of {model} done: every replica runs definition {end['definition']}")


@rollout.command("undo")
@click.argument("model")
@click.pass_context
def rollout_undo(ctx: click.Context, model: str) -> None:
    """Apply MODEL's previous definition again: its replicas roll back to it, the same
    way (the catalog file still holds the new one: fix it before the next apply)."""
    doc = client(ctx).post(f"/api/v1/models/{part(model)}/rollout/undo", {},
                           answer=messages.RolloutStatus)
    say(f"model {model}: rolling back to its previous definition {doc['definition']} "
        f"(`llmgw ctl rollout status {model} --watch` follows it); the catalog file still "
        "holds the one undone: change it before the next `llmgw ctl apply`")


@rollout.command("promote")
@click.argument("model")
@click.pass_context
def rollout_promote(ctx: click.Context, model: str) -> None:
    """Promote MODEL's canary: the new definition replaces every old replica."""
    doc = client(ctx).post(f"/api/v1/models/{part(model)}/rollout/promote", {},
                           answer=messages.RolloutStatus)
    old = doc.get("old_total", 0)
    say(f"model {model}: canary promoted; definition {doc['definition']} replaces the "
        f"{old} old replica{'' if old == 1 else 's'} (`llmgw ctl rollout status {model} "
        "--watch` follows it)")


def undo_hint(model: str) -> str:
    return (f"`llmgw ctl rollout undo {model}` goes back to the previous definition; or "
            f"apply a fixed one, or `llmgw ctl retry {model}` to try this one again")


def status_lines(doc: dict[str, Any], width: int = 100) -> list[str]:
    """What ``ctl rollout status`` prints."""
    model, state = doc["model"], doc["state"]
    since = f" for {duration(doc['for_s'])}" if doc.get("for_s") is not None else ""
    if state == "none":
        lines = [f"model {model}: no rollout; every replica runs definition "
                 f"{doc['definition']}"]
        if doc.get("previous"):
            lines.append(f"  previous definition {doc['previous']} (`llmgw ctl rollout "
                         f"undo {model}` goes back to it)")
        return lines
    if state == "failed":
        return [f"model {model}: rollout failed{since}: {doc.get('error') or '?'}",
                f"  the old replicas keep serving: {old_text(doc)}",
                f"  {undo_hint(model)}"]
    if state == "canary":
        head = (f"model {model}: canary of definition {doc['definition']} with "
                f"{doc.get('canary_percent', 0)} % of the requests{since}")
    else:
        head = (f"model {model}: rolling to definition {doc['definition']}{since} (max_surge "
                f"{doc.get('max_surge', 1)}, max_unavailable {doc.get('max_unavailable', 0)})")
    lines = [head, f"  new: {new_text(doc)}", f"  old: {old_text(doc)}"]
    if doc.get("waiting_for"):
        lines.append(f"  waiting for {waiting(doc)}")
    if state == "canary":
        lines += ["  " + line for line in version_table(doc.get("versions") or {}, width - 2)]
        lines.append(f"  `llmgw ctl rollout promote {model}` replaces the old replicas; "
                     f"`llmgw ctl rollout undo {model}` stops the canary")
    return lines


def waiting(doc: dict[str, Any]) -> str:
    return str(doc.get("waiting_for") or "").removeprefix("waiting for ").strip()


def new_text(doc: dict[str, Any]) -> str:
    return (f"{doc.get('new_ready', 0)}/{doc.get('wanted', 0)} ready"
            + (f" ({doc['new_total']} started)" if doc.get("new_total", 0)
               > doc.get("new_ready", 0) else ""))


def old_text(doc: dict[str, Any]) -> str:
    text = f"{doc.get('old_ready', 0)}/{doc.get('old_total', 0)} ready"
    if doc.get("previous"):
        text += f" (definition {doc['previous']})"
    if doc.get("draining"):
        text += f", {doc['draining']} draining"
    return text


def version_table(versions: dict[str, Any], width: int) -> list[str]:
    """Requests, errors, error rate, mean first-byte time and tokens per version."""
    if not versions:
        return ["no requests counted per version yet"]
    rows = []
    for name in sorted(versions, key=lambda v: (v != "stable", v)):
        v = versions[name]
        asked = v.get("requests", 0)
        rate = f"{100 * v.get('errors', 0) / asked:.1f} %" if asked else "-"
        first = v.get("first_byte_s")
        rows.append((name, asked, v.get("errors", 0), rate,
                     "-" if first is None else f"{first:.2f} s", v.get("tokens", 0)))
    return table(rows, ("VERSION", "REQUESTS", "ERRORS", "ERROR RATE", "FIRST BYTE", "TOKENS"),
                 width, indent=0)


def watch_line(doc: dict[str, Any]) -> str:
    """One line of ``--watch``: what changed."""
    text = f"{doc['state']}: new {new_text(doc)}, old {doc.get('old_ready', 0)} ready"
    if doc.get("draining"):
        text += f", {doc['draining']} draining"
    if doc.get("waiting_for"):
        text += f"; waiting for {waiting(doc)}"
    return text


def follow(get: Callable[[], dict[str, Any]], doc: dict[str, Any],
           sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Ask every POLL_S seconds, printing ``watch_line`` when it changes, until the state
    is none or failed; returns that answer."""
    shown = watch_line(doc)
    while doc["state"] not in ("none", "failed"):
        sleep(POLL_S)
        doc = get()
        line = watch_line(doc)
        if line != shown and doc["state"] not in ("none", "failed"):
            say(line)
        shown = line
    return doc
