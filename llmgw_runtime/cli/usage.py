"""``llmgw ctl usage``: tokens per API key and model, as the routers counted them from
the engines' usage objects and the control service stored them (docs/keys.md)."""

from __future__ import annotations

from urllib.parse import urlencode

import click

from ..api import usage as messages
from ..catalog.spec import parse_duration
from .common import client, show
from .output import output_option

BY = click.Choice(("key", "model", "key,model"))


@click.command()
@click.option("--since", default="24h", show_default=True, metavar="DURATION",
              help="how far back, like 90m, 24h or 30d (counted from the start of that hour)")
@click.option("--by", "by", type=BY, default="key,model", show_default=True,
              help="sum by key, by model, or by both")
@output_option
@click.pass_context
def usage(ctx: click.Context, since: str, by: str, fmt: str) -> None:
    """Requests and tokens (prompt, completion) per API key and model. Key "-": requests
    to a router that does not require keys; "(deleted)": a key deleted before its router
    reported."""
    try:
        parse_duration(since)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    data = client(ctx).get("/api/v1/usage?" + urlencode({"since": since, "by": by}),
                           answer=messages.UsageList)
    columns = by.split(",")
    headers = [c.upper() for c in columns] + ["REQUESTS", "PROMPT", "COMPLETION", "TOTAL"]
    rows = [[r.get(c) or "" for c in columns]
            + [r["requests"], r["prompt_tokens"], r["completion_tokens"],
               r["prompt_tokens"] + r["completion_tokens"]] for r in data["rows"]]
    show(data, rows, headers, fmt)
