"""``llmgw ctl usage``: requests, tokens and refusals per API key and model, as the routers
counted them (tokens from the engines' usage objects) and the control service stored them
(docs/keys.md); with
``--gpu-hours`` the device-hours the models' replicas held, per device class, shared per
key by tokens, and their cost (docs/operations.md, "GPU-hours")."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import click

from ..api import usage as messages
from ..catalog.spec import parse_duration
from .common import client, show
from .output import output_option

BY = click.Choice(("key", "model", "key,model"))
UNATTRIBUTED = "(unattributed)"     # the KEY of hours no key's tokens account for


@click.command()
@click.option("--since", default="24h", show_default=True, metavar="DURATION",
              help="how far back, like 90m, 24h or 30d (counted from the start of that hour)")
@click.option("--by", "by", type=BY, default="key,model", show_default=True,
              help="sum by key, by model, or by both")
@click.option("--gpu-hours", "gpu_hours", is_flag=True,
              help="device-hours the models' replicas held per device class (a key's: "
                   "its share of each model's tokens, hour by hour), and their cost")
@output_option
@click.pass_context
def usage(ctx: click.Context, since: str, by: str, fmt: str, gpu_hours: bool) -> None:
    """Requests and tokens (prompt, completion) per API key and model, and the key's
    requests the routers refused (over its limits, outside its scope, expired, queue full
    or wait too long, ...). Key "-": requests to a router that does not require keys;
    "(deleted)": a key deleted before its router reported. With --gpu-hours: device-hours and cost per model or key and device class;
    key "(unattributed)": hours of a model that used no tokens in that hour."""
    try:
        parse_duration(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    if gpu_hours:
        _gpu_hours(ctx, since, by, fmt)
        return
    data = client(ctx).get("/api/v1/usage?" + urlencode({"since": since, "by": by}),
                           answer=messages.UsageList)
    columns = by.split(",")
    headers = [c.upper() for c in columns] + ["REQUESTS", "PROMPT", "COMPLETION", "TOTAL",
                                              "REFUSED"]
    rows = [[r.get(c) or "" for c in columns]
            + [r["requests"], r["prompt_tokens"], r["completion_tokens"],
               r["prompt_tokens"] + r["completion_tokens"], r.get("refused", 0)]
            for r in data["rows"]]
    show(data, rows, headers, fmt)


def _gpu_hours(ctx: click.Context, since: str, by: str, fmt: str) -> None:
    data = client(ctx).get("/api/v1/usage/gpu-hours?" + urlencode({"since": since, "by": by}),
                           answer=messages.DeviceHoursList)
    columns = by.split(",")
    headers = [c.upper() for c in columns] + ["CLASS", "DEVICE-HOURS", "COST"]
    rows = [[r.get(c) or "" for c in columns] + [r["device_class"], r["device_hours"],
                                                  r.get("cost")] for r in data["rows"]]
    rows += unattributed_rows(data.get("unattributed", []), columns)
    show(data, [row[:-2] + [f"{row[-2]:.3f}", "-" if row[-1] is None else f"{row[-1]:.2f}"]
                for row in rows], headers, fmt)


def unattributed_rows(rows: list[dict[str, Any]], columns: list[str]) -> list[list[Any]]:
    """The answer's unattributed hours (per model and class) as table rows under the key
    "(unattributed)", summed per class when the table has no MODEL column."""
    summed: dict[tuple[str, str], list[Any]] = {}
    for r in rows:
        model = r["model"] if "model" in columns else ""
        row = summed.setdefault((model, r["device_class"]), [0.0, None])
        row[0] += r["device_hours"]
        if r.get("cost") is not None:
            row[1] = (row[1] or 0.0) + r["cost"]
    return [[UNATTRIBUTED] + ([model] if model else []) + [klass, hours, cost]
            for (model, klass), (hours, cost) in sorted(summed.items())]
