"""``llmgw ctl nodes``: the nodes with their devices, and what an operator does to one:
cordon it (no new replicas), drain it (move its replicas elsewhere, each replacement ready
before the old one drains: kubectl's ``cordon``/``drain``), uncordon it, reset its
credential, delete it (docs/operations.md)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click

from ..catalog.spec import parse_duration
from ..status.summary import device_label
from ..status.tables import duration
from .common import client, part, request_body, say, show
from .lazy import lazy
from .output import ago, output_option

messages = lazy("llmgw_runtime.api.admin")   # loaded when a command uses it

POLL_S = 2.0          # how often --wait asks how the drain goes


@click.group(invoke_without_command=True)
@output_option
@click.pass_context
def nodes(ctx: click.Context, fmt: str) -> None:
    """Nodes and their devices (``0``, ``0/mig1``), class, memory and health, and whether
    one is cordoned or draining; ``nodes cordon``/``uncordon``/``drain NAME`` take one out
    for maintenance and back, ``nodes reset NAME`` and ``nodes delete NAME`` revoke one."""
    if ctx.invoked_subcommand is not None:
        return
    data = client(ctx).get("/api/v1/nodes", answer=messages.NodeList)
    show(data, node_rows(data["nodes"], time.time()),
         ("NODE", "REPORTED", "DEVICE", "CLASS", "MEMORY", "HEALTH"), fmt)


def node_rows(nodes_: list[dict[str, Any]], now: float) -> list[tuple[str, ...]]:
    """One row per device, then one per card that can run nothing, with the reason; a
    cordoned or draining node says so first."""
    rows: list[tuple[str, ...]] = []
    for node in nodes_:
        lines: list[tuple[str, ...]] = []
        for dev in node["devices"]:
            memory = (f"{dev.get('memory_used_mb', 0) / 1024:.1f}/"
                      f"{dev.get('memory_total_mb', 0) / 1024:.1f} GB")
            health = "ok" if dev.get("healthy", True) else f"UNHEALTHY: {dev.get('reason')}"
            lines.append((device_label(dev), dev["class"], memory, health))
        hardware = node.get("hardware") or {}
        for card in hardware.get("cards", []):
            if card.get("problem"):
                lines.append((f"{card['index']} (card)", card.get("klass") or "-", "-",
                              f"RUNS NOTHING: {card['problem']}"))
        if not lines:
            problems = "; ".join(hardware.get("problems", [])) or "no devices reported"
            lines.append(("-", "-", "-", problems))
        if node.get("problem"):
            lines.insert(0, ("-", "-", "-", f"PROBLEM: {node['problem']}"))
        held = maintenance(node)
        if held:
            lines.insert(0, ("-", "-", "-", held))
        for i, line in enumerate(lines):
            rows.append(((node["name"], ago(node["last_report"], now)) if i == 0
                         else ("", "")) + line)
    return rows


def node_lines(nodes_: list[dict[str, Any]], now: float) -> list[tuple[str, ...]]:
    """One row per node (``ctl status --nodes``): its fabric, whether it is cordoned or
    draining, healthy devices of all, when it last reported, and its problem."""
    rows: list[tuple[str, ...]] = []
    for node in nodes_:
        devices = node.get("devices") or []
        healthy = sum(1 for d in devices if d.get("healthy", True))
        state = ("draining" if node.get("draining") else
                 "cordoned" if node.get("cordoned") else "-")
        rows.append((node["name"], node.get("fabric") or "-", state,
                     f"{healthy}/{len(devices)}", ago(node.get("last_report"), now),
                     node.get("problem") or ""))
    return rows


def maintenance(node: dict[str, Any]) -> str | None:
    """``DRAINING: ...`` or ``CORDONED: ...`` for a node taken out, else None (short: it
    fits an 80-column HEALTH cell)."""
    if node.get("draining"):
        return "DRAINING: its replicas move elsewhere"
    if node.get("cordoned"):
        return "CORDONED: no new replicas here (uncordon takes it back)"
    return None


@nodes.command("reset")
@click.argument("name")
@click.pass_context
def nodes_reset(ctx: click.Context, name: str) -> None:
    """Forget NAME's node credential: its host (reinstalled, or with a leaked credential)
    joins again with the join token; the old credential is refused at once."""
    client(ctx).post(f"/api/v1/nodes/{part(name)}/reset", {})
    say(f"node {name}: credential reset; its agent joins again with the join token")


@nodes.command("delete")
@click.argument("name")
@click.option("--force", is_flag=True,
              help="delete it even though it reported within the node timeout")
@click.pass_context
def nodes_delete(ctx: click.Context, name: str, force: bool) -> None:
    """Delete node NAME (a host that is gone) and the replicas that used it; they are
    placed again elsewhere. Refused while it still reports, unless --force."""
    result = client(ctx).request("DELETE", f"/api/v1/nodes/{part(name)}"
                                 + ("?force=true" if force else ""))
    gone = result.get("replicas") or []
    say(f"node {name} deleted" + (f" with {len(gone)} replica(s), placed again elsewhere: "
                                  + ", ".join(gone) if gone else ""))


@nodes.command("cordon")
@click.argument("name")
@click.pass_context
def nodes_cordon(ctx: click.Context, name: str) -> None:
    """No new replica is placed on node NAME; what runs there keeps running (``nodes
    drain`` moves it)."""
    client(ctx).post(f"/api/v1/nodes/{part(name)}/cordon", {}, answer=messages.NodeDrain)
    say(f"node {name} cordoned: no new replica is placed there; what runs there keeps "
        f"running (`llmgw ctl nodes drain {name}` moves it)")


@nodes.command("uncordon")
@click.argument("name")
@click.pass_context
def nodes_uncordon(ctx: click.Context, name: str) -> None:
    """Node NAME takes new replicas again (ends a drain, done or not)."""
    client(ctx).post(f"/api/v1/nodes/{part(name)}/uncordon", {}, answer=messages.NodeDrain)
    say(f"node {name} uncordoned: new replicas may be placed there again")


@nodes.command("drain")
@click.argument("name")
@click.option("--force", is_flag=True,
              help="drain even the replicas that have nowhere to go (their models lose "
                   "capacity until there is room)")
@click.option("--wait", is_flag=True,
              help="follow the drain, printing its progress, until every replica moved")
@click.option("--timeout", default=None, metavar="DURATION",
              help="with --wait (implied), give up waiting after this long, like 10m "
                   "(0: wait forever, the default); the drain goes on")
@click.pass_context
def nodes_drain(ctx: click.Context, name: str, force: bool, wait: bool,
                timeout: str | None) -> None:
    """Cordon node NAME and move its replicas elsewhere: each gets a replacement first,
    and drains (finishes its requests in flight, then stops) once that is ready. Refused,
    naming the models that would lose capacity, where the fleet has no room for them,
    unless --force."""
    limit = wait_limit(timeout)
    api = client(ctx)
    body = request_body(messages.DrainRequest, {"force": "--force"}, force=force)
    answer = api.post(f"/api/v1/nodes/{part(name)}/drain", body, answer=messages.NodeDrain)
    if answer.get("done"):
        say(drained_line(answer))
        return
    say(f"node {name} cordoned and draining: {progress_line(answer)}")
    if not (wait or timeout is not None):
        say(f"follow it with `llmgw ctl nodes drain {name} --wait`")
        return
    path = f"/api/v1/nodes/{part(name)}/drain"
    done, last = follow(lambda: api.get(path, answer=messages.NodeDrain), limit,
                        progress_line(answer))
    if done is None:
        raise click.ClickException(
            f"timed out after {duration(limit or 0)} waiting for node {name} to drain: "
            f"{last}; the drain goes on (`llmgw ctl nodes drain {name} --wait` follows "
            "it again)")
    say(drained_line(done))


def wait_limit(timeout: str | None) -> float | None:
    """--timeout as seconds: None (or ``0``) waits forever."""
    if timeout is None or timeout.strip() in ("0", "0s"):
        return None
    try:
        return parse_duration(timeout)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--timeout") from None


def follow(get: Callable[[], dict[str, Any]], limit: float | None, shown: str,
           clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep
           ) -> tuple[dict[str, Any] | None, str]:
    """Ask how the drain goes every POLL_S seconds, printing its progress line when it
    changes, until it is done (returns its answer) or ``limit`` seconds passed (returns
    None and the last progress line)."""
    deadline = None if limit is None else clock() + limit
    while True:
        if deadline is not None and clock() >= deadline:
            return None, shown
        sleep(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - clock())))
        answer = get()
        if answer.get("done"):
            return answer, shown
        line = progress_line(answer)
        if line != shown:
            say(line)
            shown = line


def progress_line(answer: dict[str, Any]) -> str:
    """``moved 3/5, waiting for r-abc to be ready``."""
    text = f"moved {answer.get('moved', 0)}/{answer.get('total', 0)}"
    waiting = (answer.get("waiting_for") or "").removeprefix("waiting for ").strip()
    return text + (f", waiting for {waiting}" if waiting else "")


def drained_line(answer: dict[str, Any]) -> str:
    name = answer["node"]
    total = answer.get("total", 0)
    moved = (f"{answer.get('moved', 0)}/{total} replicas moved" if total
             else "no replica to move")
    return (f"node {name} drained ({moved}); it stays cordoned until `llmgw ctl nodes "
            f"uncordon {name}`")
