"""Usage in the router: each request's tokens, counted per API key and model, and reported
to the control service, which stores them (docs/keys.md, "Usage").

- :class:`Meter`, one per request: asks a chat or text completion stream's engine for its
  usage when the client did not (``tokens.usage_asked``), reads the tokens of every 2xx
  answer as it passes (``tokens.py``), adds them to this worker's book, and when the
  request ends settles its key's token limit (``tables/limits.py``) with them.
- :class:`UsageBook`, one per worker: requests, tokens and refusals per (key hash, model)
  since the last report (a refusal booked by ``wsgi.py`` when it answers a known key's
  request with the router's own error: ``api.usage.UsageEntry.refused``).
- :class:`UsageReporter`: once a tick (the routes loop) posts what the book gathered as
  a report numbered per worker (``api.usage.UsageReport``); a report that got no answer
  is sent again, same number, until one comes, so the control service counts it once.
  The worker's last usage is posted when it exits (``serve.py``).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pydantic

from ..api.usage import MAX_USAGE_ENTRIES, UsageEntry, UsageReport
from .proxy import Answered, Stream
from .tables.limits import KeyLimit, Limiter
from .tokens import BodyScan, StreamScan, Tokens, asking_usage_body, usage_asked, usage_in_body

log = logging.getLogger(__name__)

METER = "llmgw.meter"         # in the environ: the request's Meter
KEY_ID = "llmgw.key_id"       # in the environ: the API key's sha256 (the fairness key), or "-"
PROBLEM_REPEAT_S = 600.0      # a failing report is logged again after this long


class UsageBook:
    """Requests, tokens and refusals per (key hash, model) of this worker, since the last
    report: each value is [requests, prompt tokens, completion tokens, refused]."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], list[int]] = {}

    def add(self, key_id: str, model: str, tokens: Tokens | None) -> None:
        with self._lock:
            counts = self._counts.get((key_id, model))
            if counts is None:
                counts = self._counts[(key_id, model)] = [0, 0, 0, 0]
            counts[0] += 1
            if tokens is not None:
                counts[1] += tokens.prompt
                counts[2] += tokens.completion

    def refused(self, key_id: str, model: str) -> None:
        """One request of the key ``key_id`` (a hash of the table's keys) to ``model`` that
        the router refused (api.usage.UsageEntry.refused says which)."""
        with self._lock:
            counts = self._counts.get((key_id, model))
            if counts is None:
                counts = self._counts[(key_id, model)] = [0, 0, 0, 0]
            counts[3] += 1

    def take(self, most: int = MAX_USAGE_ENTRIES) -> dict[tuple[str, str], list[int]]:
        """Up to ``most`` entries, removed from the book."""
        with self._lock:
            if len(self._counts) <= most:
                taken, self._counts = self._counts, {}
                return taken
            keys = list(self._counts)[:most]
            return {k: self._counts.pop(k) for k in keys}


def new_reporter_id() -> str:
    """A name for this worker process's reports: its host, pid and a random part (a new
    worker, even with a reused pid, starts its own numbering)."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:60]
    return f"router-{host}-{os.getpid()}-{secrets.token_hex(4)}"


class UsageReporter:
    """Posts the book's counts as numbered reports; ``post`` raises nothing.

    ``send`` posts one report and returns; it raises ``retry`` errors when the report may
    not have arrived (it is sent again, same number, next time) and ``refused`` errors
    when the control service refused it as malformed (it is dropped, with an error in the
    log: sending it again would not help)."""

    def __init__(self, book: UsageBook, send: Callable[[UsageReport], Any],
                 retry: tuple[type[Exception], ...], refused: tuple[type[Exception], ...] = (),
                 reporter: str | None = None) -> None:
        self._book = book
        self._send = send
        self._retry = retry
        self._refused = refused
        self.reporter = reporter or new_reporter_id()
        self._seq = 0
        self._pending: UsageReport | None = None
        self._lock = threading.Lock()
        self._problem: tuple[str, float] | None = None

    def post(self) -> bool:
        """Send the report that got no answer yet, else a new one of what the book has;
        True when there was nothing to send."""
        with self._lock:
            if self._pending is None:
                self._pending = self._next()
                if self._pending is None:
                    return True
            try:
                self._send(self._pending)
            except self._refused as exc:
                log.error("usage report %s/%d refused by the control service, dropped "
                          "(%d entries): %s", self.reporter, self._pending.seq,
                          len(self._pending.entries), exc)
            except self._retry as exc:
                self._note(str(exc))
                return False
            self._pending = None
            self._note(None)
            return False

    def flush(self, rounds: int = 4) -> None:
        """Post until the book is empty (at most ``rounds`` reports): a worker's last
        usage, when it exits."""
        for _ in range(rounds):
            if self.post():
                return

    def _next(self) -> UsageReport | None:
        taken = self._book.take()
        if not taken:
            return None
        try:
            # refused only when some were (an older control service refuses the field)
            entries = [UsageEntry(key=key, model=model, requests=n, prompt_tokens=p,
                                  completion_tokens=c, **({"refused": r} if r else {}))
                       for (key, model), (n, p, c, r) in taken.items()]
            report = UsageReport(reporter=self.reporter, seq=self._seq + 1, entries=entries)
        except pydantic.ValidationError as exc:      # a bug: never stop the tick for it
            log.error("usage of %d (key, model) pairs not reportable, dropped: %s",
                      len(taken), exc)
            return None
        self._seq += 1
        return report

    def _note(self, problem: str | None) -> None:
        """Log a failing post when its reason changes or every ten minutes."""
        now = time.monotonic()
        if problem is None:
            if self._problem is not None:
                log.info("usage reports reach the control service again")
            self._problem = None
            return
        if self._problem is None or self._problem[0] != problem \
                or now - self._problem[1] >= PROBLEM_REPEAT_S:
            log.warning("usage report %s/%d not delivered (%s); kept and sent again, and "
                        "the usage since is kept for the next report", self.reporter,
                        self._pending.seq if self._pending else 0, problem)
            self._problem = (problem, now)


class Meter:
    """One request's usage and, for a key with a token limit, its settlement."""

    __slots__ = ("key_id", "_book", "_limiter", "_limit", "_estimate", "_prompt", "_strip",
                 "_tokens", "_answered", "_finished", "_tap", "on_tokens")

    def __init__(self, key_id: str, book: UsageBook, limiter: Limiter | None = None,
                 limit: KeyLimit | None = None, estimate: int = 0, prompt: int = 0) -> None:
        self.key_id = key_id
        self._book = book
        self._limiter = limiter
        self._limit = limit
        self._estimate = estimate     # charged at admission: prompt and most output
        self._prompt = prompt         # the prompt's estimate alone
        self._tap: tuple[Stream, _Tap] | None = None
        self._strip = False
        self._tokens: int | None = None
        self._answered = False
        self._finished = False
        # a canary's version counts the tokens too (canary.VersionTap.tokens)
        self.on_tokens: Callable[[Tokens | None], None] | None = None

    def prepare(self, path: str, doc: dict[str, Any], body: bytes) -> bytes:
        """The body to send: for a completion stream whose client did not ask for its
        usage, one that asks (its usage chunk is removed on the way back)."""
        self._strip = usage_asked(path, doc)
        return asking_usage_body(doc, body) if self._strip else body

    def observe(self, answer: Answered, model: str, path: str) -> Answered:
        """``answer``, its tokens read: a whole answer now, a stream as it passes."""
        if not 200 <= answer.status < 300:
            return answer
        self._answered = True
        body = answer.body
        if not isinstance(body, Stream):   # a whole answer (the proxy's other kind)
            self.record(model, usage_in_body(path, b"".join(body)))
            return answer
        ctype = next((v for k, v in answer.headers if k.lower() == "content-type"), "")
        scan = (StreamScan(path, self._strip) if ctype.startswith("text/event-stream")
                else BodyScan(path))
        body.scan = scan
        tap = _Tap(scan, self, model)
        body.on_close(tap.close)
        self._tap = (body, tap)
        return answer

    def record(self, model: str, tokens: Tokens | None) -> None:
        self._book.add(self.key_id, model, tokens)
        if self.on_tokens is not None:
            self.on_tokens(tokens)
        if tokens is not None:
            self._tokens = (self._tokens or 0) + tokens.prompt + tokens.completion

    def done(self, body: Iterable[bytes]) -> None:
        """The request's answer is ``body``: settle now, or when it is a metered stream,
        once it closes."""
        if self._tap is not None and self._tap[0] is body:
            self._tap[1].final = True
        else:
            self.finish()

    def cut_short(self, scan: StreamScan | BodyScan) -> Tokens | None:
        """The tokens of a stream that ended without the engine's count (its client left
        first): the prompt's estimate and one completion token per data event relayed."""
        events = getattr(scan, "events", 0)
        return Tokens(self._prompt, events) if events else None

    def finish(self) -> None:
        """Settle the key's token limit with the tokens the engine said (for a stream cut
        short, what was relayed, or the estimate when nothing was counted; nothing when no
        engine answered)."""
        if self._finished:
            return
        self._finished = True
        if self._limiter is None or self._limit is None or self._limit.tpm is None:
            return
        used = self._tokens if self._tokens is not None else (
            self._estimate if self._answered else 0)
        self._limiter.settle(self.key_id, self._limit, self._estimate, used)


class _Tap:
    """The usage of a :class:`~.proxy.Stream`: recorded (and, for the request's final
    answer, settled) when the stream closes."""

    __slots__ = ("_scan", "_meter", "_model", "final")

    def __init__(self, scan: StreamScan | BodyScan, meter: Meter, model: str) -> None:
        self._scan = scan
        self._meter = meter
        self._model = model
        self.final = False

    def close(self) -> None:
        tokens = self._scan.tokens
        if tokens is None:
            tokens = self._meter.cut_short(self._scan)
        self._meter.record(self._model, tokens)
        if self.final:
            self._meter.finish()
