"""Usage: the tokens routers count per API key and model, reported to the control service
(``POST /api/v1/usage``), and the admin API's view of what is stored (``GET /api/v1/usage``).

A report is applied at most once: each router worker names itself (``reporter``, new for
every worker process) and numbers its reports (``seq``, from 1); the control service
applies a report only when its number is above the last one it applied for that reporter
and answers ``applied: false`` otherwise, so a report retried after a lost answer is not
counted twice (docs/keys.md, "Usage")."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictStr

from .fields import ID_RE, MAX_INT, Answer, Bool, Count, Finite, Message, Name, NonNegative

MAX_USAGE_ENTRIES = 10_000     # (key, model) pairs in one report
# One entry's counts: far above what a router worker serves between two reports (seconds
# apart), far below what would overflow a sum of a whole report in the store (whose rows
# stop at MAX_INT, store/usage.py).
MAX_ENTRY_REQUESTS = 10**9
MAX_ENTRY_TOKENS = 10**12
NO_KEY = "-"                   # requests to a router that does not require API keys
UNKNOWN_MODEL = "(unknown)"    # usage reported of a model the catalog does not have
MAX_REPORTER = 100
# A key's SHA-256 (the routers know only hashes), or "-" for requests without a key.
KeyRef = Annotated[StrictStr, Field(pattern=r"^([0-9a-f]{64}|-)$")]
Reporter = Annotated[StrictStr, Field(min_length=1, max_length=MAX_REPORTER, pattern=ID_RE)]
Seq = Annotated[int, Field(strict=True, ge=1, le=MAX_INT)]
EntryRequests = Annotated[int, Field(strict=True, ge=0, le=MAX_ENTRY_REQUESTS)]
EntryTokens = Annotated[int, Field(strict=True, ge=0, le=MAX_ENTRY_TOKENS)]
# A model of the routes table, or "(unknown)" (UNKNOWN_MODEL) for a request refused before
# it named one the key may use (only with ``refused``).
EntryModel = Name | Literal["(unknown)"]


class UsageEntry(Message):
    """What one key used of one model since the reporter's previous report: requests the
    engine answered (2xx), and the prompt and completion tokens of their usage objects.

    ``refused``: the key's requests the router answered with its own error instead of an
    engine's answer, once the key was known to be one of the table's (valid, or expired):
    over the key's rpm or tpm limit, a model outside its scope, an expired key, the
    model's queue full or its wait too long, the model parked, stopped or failing, no
    engine reachable, a malformed request, a client that left while waiting. Not counted:
    an engine's own error answers (the engine answered), requests without a key (``-``)
    and requests with an invalid key (no key to book them under). A request refused
    before it named a model the key may use is booked as model ``(unknown)``. Sent only
    when above 0 (an older control service refuses the field); an older router omits it
    (0)."""

    key: KeyRef
    model: EntryModel
    requests: EntryRequests
    prompt_tokens: EntryTokens
    completion_tokens: EntryTokens
    refused: EntryRequests = 0


class UsageReport(Message):
    reporter: Reporter
    seq: Seq
    entries: list[UsageEntry] = Field(min_length=1, max_length=MAX_USAGE_ENTRIES)


class UsageAck(Answer):
    """``applied``: false when this reporter's report ``seq`` (or a later one) was applied
    before: a retry, counted once."""

    applied: Bool


UsageBy = Literal["key", "model", "key,model"]


class UsageRow(Answer):
    """One key's (or model's, or key and model's) usage. ``key`` is the key's name, ``-``
    for requests without a key, ``(deleted)`` for a key deleted before its router reported;
    ``model`` is ``(unknown)`` for usage a router reported of a model the catalog does not
    have. ``refused``: the key's requests the routers refused (UsageEntry.refused). Each
    count stops at MAX_INT (2^53)."""

    key: str | None = None
    model: str | None = None
    requests: Count
    prompt_tokens: Count
    completion_tokens: Count
    refused: Count = 0


class UsageList(Answer):
    """Usage from ``since`` (the start of the hour the asked period began in, store clock)
    until ``until`` (now), summed ``by`` key, model or both."""

    since: Finite
    until: Finite
    by: UsageBy
    rows: list[UsageRow]


DeviceHoursBy = Literal["model", "key", "key,model"]


class DeviceHoursRow(Answer):
    """Device-hours of one model (or key, or key and model) on one device class: the hours
    its replicas held devices of that class (starting, ready or draining); a key's are each
    model's hours shared by the key's part of that model's tokens in each hour. ``cost``:
    ``device_hours`` times the class's ``cost_per_device_hour`` (None: no price set)."""

    key: str | None = None
    model: str | None = None
    device_class: str
    device_hours: NonNegative
    cost: NonNegative | None = None


class DeviceHoursList(Answer):
    """``GET /api/v1/usage/gpu-hours``: device-hours from ``since`` (the start of the hour
    the asked period began in, store clock) until ``until`` (now), summed ``by`` key, model
    or both, per device class. ``unattributed``: a model's hours with no tokens reported
    in that hour (held but unused, or used without usage reports), per model and class
    when by key."""

    since: Finite
    until: Finite
    by: DeviceHoursBy
    rows: list[DeviceHoursRow]
    unattributed: list[DeviceHoursRow] = Field(default_factory=list)
