"""``llmgw ctl``: the operator's commands against the control service's admin API."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click

from ..catalog.spec import parse_duration
from ..status.changes import replica_state
from ..status.render import render
from ..status.summary import location
from ..status.tables import human_bytes, table
from ..status.telling import telling_line
from ..text import printable_doc
from .client import DEFAULT_URL, ApiError
from .common import client, ctrl_c_ends, part, say, show
from .keys import keys
from .lazy import lazy
from .nodes import node_lines, node_rows, nodes  # noqa: F401 - node_rows: ctl's listing
from .output import ago, emit, output_option, terminal_width
from .rollout import rollout
from .usage import usage

messages = lazy("llmgw_runtime.api.admin")   # loaded when a command uses it

URL_HELP = ("the control service [$LLMGW_CONTROL_URL, else the URL a running `llmgw up` "
            f"wrote in its state directory, else {DEFAULT_URL}]")


@click.group()
@click.option("--url", envvar="LLMGW_CONTROL_URL", default=None, help=URL_HELP)
@click.option("--token", default=None, help="admin token (or LLMGW_ADMIN_TOKEN)")
@click.option("--ca", "ca_file", envvar="LLMGW_CA_FILE", default=None,
              help="CA file that signed the control service's certificate (https URLs)")
@click.pass_context
def ctl(ctx: click.Context, url: str | None, token: str | None, ca_file: str | None) -> None:
    """Operate a running llmgw: apply the catalog, list models, nodes, replicas, events."""
    ctx.obj = {"url": url, "token": token, "ca_file": ca_file}


def telling(text: str | None) -> str:
    """An error or a message as one line: the line of it that says most
    (``status.telling``); the whole text is in ``-o json``."""
    return telling_line(text) if text else ""


@ctl.command()
@click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False),
              help="catalog YAML ('-' for standard input)")
@click.option("--prune", is_flag=True,
              help="delete models that are not in the file (shown first and asked; "
                   "--yes when standard input is not a terminal)")
@click.option("--dry-run", is_flag=True,
              help="show what would be created, updated and deleted; change nothing")
@click.option("-y", "--yes", is_flag=True, help="delete with --prune without asking")
@click.pass_context
def apply(ctx: click.Context, path: str, prune: bool, dry_run: bool, yes: bool) -> None:
    """Create or update the catalog's models."""
    if path == "-":
        text = sys.stdin.read()
    else:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise click.ClickException(f"cannot read the catalog {path}: {exc.strerror}") \
                from None
    api = client(ctx)
    from ..catalog.bounds import wire
    body, content_type = wire(text)     # JSON when it reads as plain data

    def put(dry: bool, deletes: str | None = None) -> dict[str, Any]:
        path = "/api/v1/catalog" + ("/dry-run" if dry else "") + ("?prune=true" if prune
                                                                   else "")
        if deletes:             # delete exactly what was shown, or nothing (409)
            path += f"&deletes={deletes}"
        try:
            result: dict[str, Any] = api.request("PUT", path, body, content_type,
                                                 answer=messages.CatalogResult)
        except ApiError as exc:
            if dry and exc.reason in ("not_found", "method_not_allowed"):
                raise click.ClickException(
                    f"the control service at {api.url} cannot do a dry run (it is older "
                    "than this ctl); nothing was applied. Upgrade it, or apply without "
                    "--dry-run (with --prune: --yes deletes without showing what)") from None
            raise
        return result

    shown = None
    if prune and not dry_run and not yes:
        preview = put(dry=True)
        if preview["deleted"]:
            confirm_prune(preview["deleted"], path == "-")
        shown = preview.get("deletes")
    for line in apply_lines(put(dry=dry_run, deletes=shown)):
        say(line)


def confirm_prune(names: list[str], catalog_on_stdin: bool) -> None:
    """Show the models --prune deletes and ask (y/N) on a terminal; elsewhere refuse
    without --yes. Raises ClickException when not confirmed."""
    say(f"--prune deletes {plural(len(names), 'model')} that the catalog does not name: "
        + ", ".join(names))
    if catalog_on_stdin or not sys.stdin.isatty():
        raise click.ClickException(
            f"not deleting {plural(len(names), 'model')} without confirmation: standard "
            "input is not a terminal to ask on. Pass --yes to delete them, or --dry-run to "
            "see the whole change; nothing was applied")
    if not click.confirm(f"delete {plural(len(names), 'model')}?", default=False):
        raise click.ClickException("not confirmed: nothing was applied")


def apply_lines(result: dict[str, Any]) -> list[str]:
    """What ``ctl apply`` says about the answer of ``PUT /api/v1/catalog``."""
    dry = result.get("dry_run", False)
    named = result["created"] + result["updated"] + result["unchanged"]
    kept = result.get("kept") or []
    changes = result.get("changes") or {}
    lines = [line for verb in ("created", "updated", "deleted", "unchanged")
             for name in result[verb]
             for line in change_lines(name, (f"would be {verb}" if dry and verb != "unchanged"
                                            else verb), changes.get(name), dry)]
    if not named and not result["deleted"]:
        lines.append("the catalog has no models: nothing applied" + (
            f"; the {plural(len(kept), 'model')} in the store were kept "
            f"({', '.join(kept)}): --prune deletes them all" if kept
            else " (the store has none either)"))
    elif kept:
        lines.append(f"{plural(len(kept), 'model')} not in the catalog kept: "
                     f"{', '.join(kept)} (--prune deletes them)")
    rolls = result.get("rolls") or []
    if rolls:
        lines.append(f"rolls: {', '.join(rolls)} (" + ("their replicas would be replaced"
                     if dry else "their replicas are replaced") + " by the new definition, "
                     "one at a time, each drained first: no request is dropped; "
                     "`llmgw ctl rollout status MODEL` follows one)")
    if dry:
        lines.append("dry run: nothing was changed")
    return lines


def change_lines(name: str, verb: str, change: dict[str, Any] | None, dry: bool
                 ) -> list[str]:
    """``model chat updated``, and what changes in it (api.admin.ModelChange): with
    ``--dry-run`` a line per field (``args: [...] -> [...]``) and the replicas replaced;
    else the fields' names and the replicas on the same line."""
    fields = (change or {}).get("fields") or []
    replaces = (change or {}).get("replaces") or []
    if not dry:
        said = [", ".join(f["field"] for f in fields)] if fields else []
        if replaces:
            said.append(f"replacing {', '.join(replaces)}")
        return [f"model {name} {verb}" + (f": {'; '.join(said)}" if said else "")]
    lines = [f"model {name} {verb}"]
    lines += [f"  {f['field']}: {f['old']} -> {f['new']}" for f in fields]
    if replaces:
        lines.append(f"  replaces {plural(len(replaces), 'running replica')}: "
                     f"{', '.join(replaces)}")
    return lines


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


@ctl.command()
@output_option
@click.pass_context
def models(ctx: click.Context, fmt: str) -> None:
    """Models with their state (ready, starting, parked, unplaceable ...) and rollout
    (``ready, rolling 1/2``, ``canary 10 %``, ``rollout failed``: ``ctl rollout status``)."""
    api = client(ctx)
    data = api.get("/api/v1/models", answer=messages.ModelList)
    # each model's rollout and failing streak as the fleet summary says them (the one
    # summary of every view): ``failing (3 in a row, next start in 20 s)`` for ``starting``
    said = {} if fmt == "json" else api.get("/api/v1/status")
    rolls = {r["name"]: r for r in said.get("rollouts") or []}
    failing = {m["name"]: m["failing"]["text"] for m in said.get("models") or []
               if m.get("failing")}
    rows = [(m["name"], m["engine"], m["profile"]["class"], f"{m['ready']}/{m['wanted']}",
             failing.get(m["name"], m["state"]) + (" (on demand)" if m["on_demand"] else "")
             + rollout_cell(rolls.get(m["name"])),
             m["consecutive_failures"], max_tokens_cell(m.get("max_tokens")),
             rollout_reason(rolls.get(m["name"]), telling(m["reason"])))
            for m in data["models"]]
    show(data, rows, ("MODEL", "ENGINE", "CLASS", "READY", "STATE", "FAILURES", "MAX TOKENS",
                      "REASON"), fmt, optional=(1, 2, 6))


def rollout_cell(roll: dict[str, Any] | None) -> str:
    """``, rolling 1/2``, ``, canary 10 %``, ``, rollout failed`` after the state."""
    if not roll:
        return ""
    return ", rollout failed" if roll["state"] == "failed" else f", {roll['text']}"


def rollout_reason(roll: dict[str, Any] | None, reason: str) -> str:
    """A failed rollout's error before the model's reason."""
    if not roll or roll["state"] != "failed":
        return reason
    return telling(roll["text"]) + (f"; {reason}" if reason else "")


def max_tokens_cell(cap: dict[str, Any] | None) -> str:
    """A model's max_tokens as ``ctl models`` shows it: ``256 of 4096`` (the default a
    request gets, of the most it may ask for), ``+ clamp`` when a request above is lowered,
    ``-`` without a cap."""
    if not cap or (cap.get("default") is None and cap.get("max") is None):
        return "-"
    given = "" if cap.get("default") is None else f"{cap['default']} of "
    most = "any" if cap.get("max") is None else str(cap["max"])
    return given + most + (" + clamp" if cap.get("clamp") else "")


@ctl.command()
@output_option
@click.pass_context
def replicas(ctx: click.Context, fmt: str) -> None:
    """Replicas: where each runs, its state and last error."""
    data = client(ctx).get("/api/v1/replicas", answer=messages.ReplicaList)
    now = time.time()
    rows = [(r["id"], r["model"], where(r), r["port"], state_text(r),
             ago(r["started"], now), ago(r["last_used"], now),
             telling(r["last_error"]))
            for r in data["replicas"]]
    show(data, rows, ("REPLICA", "MODEL", "NODE:DEVICES", "PORT", "STATE", "STARTED",
                      "LAST USED", "LAST ERROR"), fmt, optional=(3, 5, 6))


def where(replica: dict[str, Any]) -> str:
    """Where it runs, as every view shows it (``gpu-01:0/mig1``; status.summary.location)."""
    return location(replica)


def state_text(replica: dict[str, Any]) -> str:
    """The state, with download progress while fetching (``fetching 1.2 GB/4.0 GB 30%
    at 85.0 MB/s``), failed parts of a multi-node replica, ``draining (3 in flight, 40 s
    left)`` while it finishes its requests and ``ready, old definition`` while a rollout
    replaces it (status.changes)."""
    text = replica_state(replica)
    progress = replica.get("progress") or {}
    if replica["state"] == "fetching" and progress:
        done, total = progress.get("bytes") or 0, progress.get("total")
        text += f" {human_bytes(done)}"
        if total:
            text += f"/{human_bytes(total)} {100 * done / total:.0f}%"
        if progress.get("rate_bps"):
            text += f" at {human_bytes(progress['rate_bps'])}/s"
    waiting = [str(p["rank"]) for p in replica.get("parts") or []
               if p["state"] not in ("ready",)]
    if waiting and replica["state"] != "failed":
        text += f" (parts not ready: {', '.join(waiting)})"
    return text


@ctl.command()
@click.option("--limit", default=50, show_default=True)
@output_option
@click.pass_context
def events(ctx: click.Context, limit: int, fmt: str) -> None:
    """What happened and why, newest first."""
    data = client(ctx).get(f"/api/v1/events?limit={limit}", answer=messages.EventList)
    rows = [(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"])), e["kind"],
             e["subject"], telling(e["message"])) for e in data["events"]]
    show(data, rows, ("TIME", "KIND", "SUBJECT", "MESSAGE"), fmt)


@ctl.command()
@click.argument("model")
@click.pass_context
def retry(ctx: click.Context, model: str) -> None:
    """Unpark MODEL: forget its failures and place it again."""
    result = client(ctx).post(f"/api/v1/models/{part(model)}/retry", {},
                              answer=messages.Retried)
    if result["was_parked"]:
        say(f"model {model} unparked; it will be placed again")
    else:
        say(f"model {model} was not parked: nothing to unpark (its failure count was reset)")


@ctl.command()
@output_option
@click.option("-w", "--watch", is_flag=True, help="redraw every --interval seconds (Ctrl-C ends)")
@click.option("--interval", type=click.FloatRange(0.5), default=2.0, show_default=True,
              help="seconds between redraws with --watch")
@click.option("--idle-after", default=None,
              help="a replica unused this long counts as idle (30m, 1h; default: the "
                   "control service's LLMGW_IDLE_AFTER_S, 15m)")
@click.option("--color/--no-color", default=None,
              help="colour the output [on a terminal, unless NO_COLOR is set]")
@click.option("--nodes", "all_nodes", is_flag=True,
              help="also list every node, one line each (the summary counts them and "
                   "names the first nodes with problems)")
@click.pass_context
def status(ctx: click.Context, fmt: str, watch: bool, interval: float,
           idle_after: str | None, color: bool | None, all_nodes: bool) -> None:
    """How full the fleet is, what is broken, what holds cards nobody uses: one summary
    (JSON schema: docs/api.md), fitted to the terminal's width. Nodes are counted, not
    listed (at 10,000 nodes the screen stays one screen): --nodes lists them all."""
    path = "/api/v1/status"
    if idle_after is not None:
        try:
            path += f"?idle_after_s={parse_duration(idle_after):g}"
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--idle-after") from None
    if color is None:
        color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    api = client(ctx)
    if watch:
        ctrl_c_ends()
    try:
        while True:
            data = api.get(path)
            listed = api.get("/api/v1/nodes")["nodes"] if all_nodes else None
            if fmt == "json":
                text = json.dumps(data if listed is None else {**data, "node_list": listed},
                                  indent=2) + "\n"
            else:
                text = render(data, terminal_width(), color)
                if listed is not None:
                    text += "\n" + every_node(listed, terminal_width())
            if not watch:
                click.echo(text, nl=False, color=color)   # click strips colour off a TTY
                return
            click.clear()
            click.echo(f"every {interval:g}s, {time.strftime('%H:%M:%S')}; Ctrl-C ends\n\n"
                       + text, nl=False, color=color)
            time.sleep(interval)
    except KeyboardInterrupt:
        return


def every_node(listed: list[dict[str, Any]], width: int) -> str:
    """``ctl status --nodes``: a line per node, fitted to ``width``."""
    rows = node_lines(printable_doc(listed), time.time())
    lines = table(rows, ("NODE", "FABRIC", "HELD", "HEALTHY", "REPORTED", "PROBLEM"), width,
                  lambda text, _colour: text)
    return f"nodes ({len(rows):,}):\n" + "\n".join(lines) + "\n"


@ctl.command()
@output_option
@click.pass_context
def plan(ctx: click.Context, fmt: str) -> None:
    """What placement would do now (a dry run), and the devices by class it sees."""
    data = client(ctx).get("/api/v1/plan")
    if fmt == "json":
        emit(data, [], [], "json")
        return
    data = printable_doc(data)     # every name and reason below: no raw escapes
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    click.echo(render(data, terminal_width(), color,
                      sections=("capacity", "fabrics")), color=color)
    if not (data["starts"] or data["stops"] or data["unplaceable"]):
        click.echo("nothing to do: every model has what it wants")
    models_ = data.get("models") or {}
    for start in data["starts"]:
        held = models_.get(start["model"], {}).get("fabrics_with_weights") or []
        click.echo(f"start {start['model']} on {where(start)}"
                   + (f": {start['why']}" if start.get("why") else "")
                   + ("" if held else " (no fabric holds its weights: the agent fetches them)"))
    for stop in data["stops"]:
        click.echo(f"stop {stop['replica']} ({stop['model']} on {stop['node']}): {stop['why']}")
    for model, reason in data["unplaceable"].items():
        click.echo(f"cannot place {model}: {reason}")


@click.command("llmgw-status", params=[*ctl.params, *status.params], help=status.help)
@click.pass_context
def status_command(ctx: click.Context, url: str | None, token: str | None,
                   ca_file: str | None, **options: Any) -> None:
    ctx.obj = {"url": url, "token": token, "ca_file": ca_file}
    ctx.invoke(status, **options)


def status_main() -> None:
    """``llmgw-status``: the same as ``llmgw ctl status``, with ``ctl``'s --url, --token
    and --ca."""
    status_command.main(prog_name=os.path.basename(sys.argv[0]) or "llmgw-status")


ctl.add_command(keys)
ctl.add_command(nodes)
ctl.add_command(rollout)
ctl.add_command(usage)
