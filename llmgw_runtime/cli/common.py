"""What every ``ctl`` command group shares (``ctl.py``, ``keys.py``, ``usage.py``): the
admin API client built from ``ctl``'s options, output through the sanitiser, and request
bodies built as the API's own messages, so a bad option is refused here, naming it, by
the same definition the control service parses the body with."""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import click
import pydantic

from ..api.fields import Message
from ..api.parse import MAX_DETAILS, problems, where
from ..text import printable, printable_lines
from .client import ApiError, Client, admin_token, control_url
from .output import emit

M = TypeVar("M", bound=Message)


class SafeClient(Client):
    """The admin API client whose error messages (which quote names from the server) are
    shown through the sanitiser like everything else ``ctl`` prints."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().request(*args, **kwargs)
        except ApiError as exc:
            exc.message = printable_lines(exc.message)  # type: ignore[misc]
            raise


def client(ctx: click.Context) -> Client:
    """The admin API client of ``ctl``'s --url, --token and --ca (any subcommand's
    context: ``ctx.obj`` is the group's)."""
    url, origin = control_url(ctx.obj["url"])
    return SafeClient(url, admin_token(ctx.obj["token"]), ca_file=ctx.obj["ca_file"],
                      origin=origin)


def show(data: Any, rows: Sequence[Sequence[Any]], headers: Sequence[str], fmt: str,
         optional: Sequence[int] = ()) -> None:
    """``emit`` with every cell of a table through ``text.printable`` (a name with an
    escape sequence shows as ``\\x1b[2J``, it does not clear the screen); JSON as is.
    Fitted to the terminal, long text wrapped onto following lines (``output.table``):
    ``optional`` columns go first."""
    safe = [[printable(c) if isinstance(c, str) else c for c in row] for row in rows]
    emit(data, safe, headers, fmt, optional=optional)


def ctrl_c_ends() -> None:
    """Ctrl-C ends a watch even when this process was started with SIGINT ignored or
    blocked, which a child inherits: a background job of a script, or a parent that was
    in C's system() at that moment (Python then leaves it ignored; ``llmgw up`` does the
    same). Every watch calls it (``ctl status --watch``, ``ctl rollout status --watch``):
    in two rehearsals a status watch started by a test went on past its SIGINT, asleep
    between redraws."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def say(text: str) -> None:
    """A line of plain output, through the sanitiser (a name cannot forge a line)."""
    click.echo(printable(text))


def part(name: str) -> str:
    """A name as one URL path segment."""
    return quote(name, safe="")


def request_body(message: type[M], options: Mapping[str, str], **fields: Any) -> M:
    """``fields`` as the request ``message`` (``api.admin.KeyCreate``...): its bounds are
    the message's, checked before anything is sent. A bad field is a BadParameter naming
    its option (``options``: field -> ``--rpm``) and what the message wants."""
    try:
        return message.model_validate(fields)
    except pydantic.ValidationError as exc:
        raise bad_parameter(exc, options) from None


def bad_parameter(exc: pydantic.ValidationError, options: Mapping[str, str]
                  ) -> click.UsageError:
    """``exc`` as ctl's error: per field, what the message says of it (a field that may
    also be a word, like ``none``, fails both ways: only the number's reason is kept, the
    option's help names the word), as one BadParameter naming every option at fault."""
    said: dict[str, list[tuple[str, str]]] = {}
    for err, line in zip(exc.errors(include_url=False)[:MAX_DETAILS], problems(exc),
                         strict=False):
        loc = tuple(err["loc"])
        field = str(loc[0]) if loc else ""
        said.setdefault(field, []).append((err["type"], line.removeprefix(where(loc) + ": ")))
    reasons = {}
    for field, found in said.items():
        texts = [t for kind, t in found if kind != "literal_error"] or [t for _, t in found]
        reasons[field] = "; ".join(dict.fromkeys(texts))
    if list(reasons) == [""]:                     # of the message as a whole
        return click.UsageError(reasons[""])
    named = [options.get(field, field) for field in reasons if field]
    if len(named) == 1:
        return click.BadParameter("; ".join(reasons.values()), param_hint=named)
    return click.BadParameter("; ".join(f"{options.get(f, f) or 'the body'}: {r}"
                                        for f, r in reasons.items()), param_hint=named)
