"""Usage as the control service keeps it: a router's report applied once, and the summed
view that ``GET /api/v1/usage``, ``llmgw ctl usage`` and the console's usage page show.

A report counts once: it is applied in the same transaction that records its reporter's
sequence number, and one whose number was applied already is not applied again (a retry
after a lost answer, or the same report sent twice at once). Keys arrive as hashes
(routers know no more) and are stored by name, so a deleted key's past usage stays under
its name. A model the catalog does not have (nor had: a deleted model's row stays while
its replicas drain) is booked as ``(unknown)``, so a router token cannot add a series per
made-up name to ``/metrics``. Rows are summed per hour of the store's clock: the hour a
report arrived.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, cast

from ..api.usage import NO_KEY, UNKNOWN_MODEL, UsageBy, UsageList, UsageReport, UsageRow
from ..catalog.spec import parse_duration
from ..errors import ValidationError
from ..store import repo, usage
from ..store.usage import BY, Used

DELETED_KEY = "(deleted)"        # a key deleted before its router reported its usage
MAX_SINCE_S = 10 * 365 * 86400.0
DEFAULT_SINCE = "24h"
PERIODS = ("1h", "24h", "7d", "30d")     # the console's choices


def apply_report(conn: Any, report: UsageReport, now: float) -> bool:
    """Store ``report`` unless it was applied before; whether it was applied now."""
    if not usage.claim_report(conn, report.reporter, report.seq, now):
        return False
    names = usage.key_names(conn, (e.key for e in report.entries if e.key != NO_KEY))
    known = repo.models_named(conn, {e.model for e in report.entries})
    usage.add_usage(conn, usage.bucket_of(now), (
        Used(NO_KEY if e.key == NO_KEY else names.get(e.key, DELETED_KEY),
             model_label(e.model, known), e.requests, e.prompt_tokens, e.completion_tokens,
             e.refused)
        for e in report.entries))
    usage.prune(conn, now)
    return True


def model_label(model: str, known: Collection[str]) -> str:
    """What a reported model's usage is booked as: its name when the catalog has it,
    else ``(unknown)``."""
    return model if model in known else UNKNOWN_MODEL


def since_s(value: str | None) -> float:
    """``since`` of a query (``24h``, ``7d``, seconds), or a 400 naming the fix."""
    try:
        seconds = parse_duration(DEFAULT_SINCE if value is None else value)
    except ValueError as exc:
        raise ValidationError(f"since: {exc}") from None
    if seconds > MAX_SINCE_S:
        raise ValidationError("since: at most ten years (3650d)")
    return seconds


def by_of(value: str | None) -> UsageBy:
    """``by`` of a query: key, model or key,model (the default), or a 400."""
    by = "key,model" if value is None else value
    if by not in BY:
        raise ValidationError(f"by {by[:40]!r} is unknown; use key, model or key,model "
                              "(the default)")
    return cast(UsageBy, by)


def usage_list(conn: Any, now: float, since: float, by: UsageBy) -> UsageList:
    """Usage in the last ``since`` seconds (from the start of the hour that period began
    in), summed ``by`` key, model or both."""
    start = usage.bucket_of(now - since)
    return UsageList(since=start, until=now, by=by,
                     rows=[UsageRow(**row) for row in usage.usage_since(conn, start, by)])


def usage_view(conn: Any, now: float, since: float, by: UsageBy) -> dict[str, Any]:
    """:func:`usage_list` as JSON values (the console's usage page)."""
    return usage_list(conn, now, since, by).to_json()
