"""``llmgw ctl``: the operator's commands against the control service's admin API."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from typing import Any

import click

from .client import Client, admin_token
from .output import ago, device_id, emit, output_option


@click.group()
@click.option("--url", envvar="LLMGW_CONTROL_URL", default="http://127.0.0.1:8470",
              show_default=True, help="the control service")
@click.option("--token", default=None, help="admin token (or LLMGW_ADMIN_TOKEN)")
@click.pass_context
def ctl(ctx: click.Context, url: str, token: str | None) -> None:
    """Operate a running llmgw: apply the catalog, list models, nodes, replicas, events."""
    ctx.obj = {"url": url, "token": token}


def client(ctx: click.Context) -> Client:
    return Client(ctx.obj["url"], admin_token(ctx.obj["token"]))


@ctl.command()
@click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False),
              help="catalog YAML ('-' for standard input)")
@click.option("--prune", is_flag=True, help="delete models that are not in the file")
@click.pass_context
def apply(ctx: click.Context, path: str, prune: bool) -> None:
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
    result = client(ctx).request("PUT", "/api/v1/catalog" + ("?prune=true" if prune else ""),
                                 text.encode(), "application/yaml")
    for verb in ("created", "updated", "deleted", "unchanged"):
        for name in result.get(verb, []):
            click.echo(f"model {name} {verb}")


@ctl.command()
@output_option
@click.pass_context
def models(ctx: click.Context, fmt: str) -> None:
    """Models with their state (ready, starting, parked, unplaceable ...)."""
    data = client(ctx).get("/api/v1/models")
    rows = [(m["name"], m["engine"], m["profile"]["class"], f"{m['ready']}/{m['wanted']}",
             m["state"] + (" (on demand)" if m["on_demand"] else ""),
             m["consecutive_failures"], m["reason"] or "")
            for m in data["models"]]
    emit(data, rows, ("MODEL", "ENGINE", "CLASS", "READY", "STATE", "FAILURES", "REASON"),
         fmt)


@ctl.command()
@output_option
@click.pass_context
def nodes(ctx: click.Context, fmt: str) -> None:
    """Nodes and their devices (``0``, ``0/mig1``), class, memory and health."""
    data = client(ctx).get("/api/v1/nodes")
    now = time.time()
    rows = []
    for node in data["nodes"]:
        devices = node["devices"] or [None]
        for i, dev in enumerate(devices):
            first = i == 0
            rows.append((
                node["name"] if first else "", ago(node["last_report"], now) if first else "",
                device_id(dev) if dev else "-", dev["class"] if dev else "-",
                f"{dev.get('memory_used_mb', 0) / 1024:.1f}/"
                f"{dev.get('memory_total_mb', 0) / 1024:.1f} GB" if dev else "-",
                ("ok" if dev["healthy"] else f"UNHEALTHY: {dev.get('reason')}") if dev
                else "no devices"))
    emit(data, rows, ("NODE", "REPORTED", "DEVICE", "CLASS", "MEMORY", "HEALTH"), fmt)


@ctl.command()
@output_option
@click.pass_context
def replicas(ctx: click.Context, fmt: str) -> None:
    """Replicas: where each runs, its state and last error."""
    data = client(ctx).get("/api/v1/replicas")
    now = time.time()
    rows = [(r["id"], r["model"], r["node"], ",".join(map(str, r["devices"])), r["port"],
             r["state"], ago(r["started"], now), ago(r["last_used"], now),
             (r["last_error"] or "").splitlines()[-1][:80] if r["last_error"] else "")
            for r in data["replicas"]]
    emit(data, rows, ("REPLICA", "MODEL", "NODE", "DEVICES", "PORT", "STATE", "STARTED",
                      "LAST USED", "LAST ERROR"), fmt)


@ctl.command()
@click.option("--limit", default=50, show_default=True)
@output_option
@click.pass_context
def events(ctx: click.Context, limit: int, fmt: str) -> None:
    """What happened and why, newest first."""
    data = client(ctx).get(f"/api/v1/events?limit={limit}")
    rows = [(time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["time"])), e["kind"],
             e["subject"], e["message"]) for e in data["events"]]
    emit(data, rows, ("TIME", "KIND", "SUBJECT", "MESSAGE"), fmt)


@ctl.command()
@click.argument("model")
@click.pass_context
def retry(ctx: click.Context, model: str) -> None:
    """Unpark MODEL: forget its failures and place it again."""
    client(ctx).post(f"/api/v1/models/{model}/retry", {})
    click.echo(f"model {model} unparked; it will be placed again")


@ctl.command()
@output_option
@click.pass_context
def status(ctx: click.Context, fmt: str) -> None:
    """One screen: models by state, devices by class, replicas by state."""
    c = client(ctx)
    models_ = c.get("/api/v1/models")["models"]
    nodes_ = c.get("/api/v1/nodes")["nodes"]
    replicas_ = c.get("/api/v1/replicas")["replicas"]
    summary = summarize(models_, nodes_, replicas_)
    if fmt == "json":
        emit(summary, [], [], "json")
        return
    click.echo(f"nodes: {summary['nodes']}   replicas: "
               + (", ".join(f"{k} {v}" for k, v in summary["replicas"].items()) or "none"))
    click.echo("devices by class: " + (", ".join(
        f"{k} {v['used']}/{v['total']} used" + (f" ({v['unhealthy']} unhealthy)"
                                                if v["unhealthy"] else "")
        for k, v in summary["devices"].items()) or "none"))
    for m in summary["models"]:
        line = f"  {m['name']}: {m['state']} {m['ready']}/{m['wanted']}"
        click.echo(line + (f" - {m['reason']}" if m["reason"] else ""))


def summarize(models_: list[dict[str, Any]], nodes_: list[dict[str, Any]],
              replicas_: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts for ``ctl status`` (a pure function of the admin API's listings)."""
    used = {(r["node"], d) for r in replicas_ if r["desired"]
            and r["state"] in ("pending", "starting", "ready") for d in r["devices"]}
    devices: dict[str, Counter[str]] = {}
    for node in nodes_:
        for dev in node["devices"]:
            count = devices.setdefault(dev["class"], Counter())
            count["total"] += 1
            if not dev.get("healthy", True):
                count["unhealthy"] += 1
            elif (node["name"], dev["id"]) in used:
                count["used"] += 1
    return {
        "nodes": len(nodes_),
        "replicas": dict(Counter(r["state"] for r in replicas_)),
        "devices": {k: {"total": v["total"], "used": v["used"], "unhealthy": v["unhealthy"],
                        "free": v["total"] - v["used"] - v["unhealthy"]}
                    for k, v in sorted(devices.items())},
        "models": [{"name": m["name"], "state": m["state"], "ready": m["ready"],
                    "wanted": m["wanted"], "reason": m["reason"]} for m in models_],
    }


@ctl.group()
def keys() -> None:
    """Router API keys (stored hashed; a key is shown only when created)."""


@keys.command("create")
@click.argument("name")
@click.pass_context
def keys_create(ctx: click.Context, name: str) -> None:
    result = client(ctx.parent).post("/api/v1/keys", {"name": name})  # type: ignore[arg-type]
    click.echo(f"API key {result['name']} (shown once; store it now):")
    click.echo(result["key"])


@keys.command("list")
@output_option
@click.pass_context
def keys_list(ctx: click.Context, fmt: str) -> None:
    data = client(ctx.parent).get("/api/v1/keys")  # type: ignore[arg-type]
    emit(data, [(k["name"], ago(k["created"])) for k in data["keys"]], ("NAME", "CREATED"), fmt)


def status_args(argv: list[str]) -> list[str]:
    """``llmgw-status [--url U] [--token T] [-o json]`` as ``ctl`` arguments."""
    front: list[str] = []
    rest: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in ("--url", "--token"):
            front += [arg, next(it, "")]
        elif arg.startswith(("--url=", "--token=")):
            front.append(arg)
        else:
            rest.append(arg)
    return [*front, "status", *rest]


def status_main() -> None:
    """``llmgw-status``: the same as ``llmgw ctl status``."""
    ctl.main(args=status_args(sys.argv[1:]), prog_name=os.path.basename(sys.argv[0]))
