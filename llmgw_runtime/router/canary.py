"""Canary rollouts in the router: which version of a model each request goes to, and what
each version did (docs/operations.md, "Canary").

While a model's routes entry has ``canary_percent`` > 0 and endpoints of both kinds
(``Endpoint.canary``), each request picks a version (:func:`pick`): a model routed by
prefix affinity by its conversation (its prefix key, :func:`.admission.affinity.prefix_key`,
taken modulo 100 against the percent: every turn of a conversation lands on the same
version, and the prompt cache of its home keeps working), any other at random. Admission
then sees only that version's endpoints; when the picked version has none usable, the
other serves.

:class:`VersionBook` counts, per model and version, the requests, errors (the engine's 5xx,
a stream the engine broke off, the router failing to reach any replica), tokens (what the
usage meter read) and the time to the first byte, for the control service (posted each
tick as ``IdleMap.versions``: counts since the last post; it rolls a canary back on
them) and for Prometheus (``llmgw_router_version_*``). Nothing of this runs for a model
without a canary but one integer test.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..api.router import Endpoint, ModelVersions, RouteModel, VersionCounts
from .metrics import RouterMetrics
from .proxy import Answered, Stream
from .tokens import Tokens

STABLE, CANARY = "stable", "canary"
_BIG = 1_000_000            # api.fields.SmallCount
_MAX_TOKENS = 10 ** 12
_MAX_SECONDS = 1e7
_rand = random.Random()


def pick(route: RouteModel, prefix: bytes | None,
         usable: Callable[[Sequence[Endpoint]], tuple[Endpoint, ...]]
         ) -> tuple[str, tuple[Endpoint, ...]] | None:
    """The version a request of ``route`` goes to and its endpoints, or None when no canary
    holds (no share, or not both versions listed). ``prefix``: its prefix key when the
    model routes by prefix affinity (the same conversation, the same version)."""
    percent = route.canary_percent
    if not percent:
        return None
    canary = tuple(e for e in route.endpoints if e.canary)
    if not canary or len(canary) == len(route.endpoints):
        return None
    stable = tuple(e for e in route.endpoints if not e.canary)
    roll = (int.from_bytes(prefix[-4:], "big") if prefix else _rand.getrandbits(32)) % 100
    if roll < percent:
        version, chosen, other = CANARY, canary, stable
    else:
        version, chosen, other = STABLE, stable, canary
    if not usable(chosen) and usable(other):
        return (STABLE if version == CANARY else CANARY), other
    return version, chosen


class VersionBook:
    """This worker's counts per (model, version) since the last post, and the Prometheus
    series of the same."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        # (model, version) -> [requests, errors, tokens, first-byte seconds, answered]
        self._counts: dict[tuple[str, str], list[Any]] = {}

    def tap(self, model: str, version: str, started: float) -> VersionTap:
        """One request's counter (``started``: ``time.perf_counter()`` at its arrival)."""
        return VersionTap(self, model, version, started)

    def _row(self, model: str, version: str) -> list[Any]:
        row = self._counts.get((model, version))
        if row is None:
            row = self._counts[(model, version)] = [0, 0, 0, 0.0, 0]
        return row

    def ended(self, model: str, version: str, error: bool) -> None:
        with self._lock:
            row = self._row(model, version)
            row[0] += 1
            row[1] += error
        metrics = self._metrics
        metrics.child(metrics.version_requests, model, version,
                      "error" if error else "ok").inc()

    def first_byte(self, model: str, version: str, seconds: float) -> None:
        with self._lock:
            row = self._row(model, version)
            row[3] += seconds
            row[4] += 1
        metrics = self._metrics
        metrics.child(metrics.version_first_byte, model, version).observe(seconds)

    def tokens(self, model: str, version: str, tokens: Tokens | None) -> None:
        if tokens is None:
            return
        with self._lock:
            self._row(model, version)[2] += tokens.prompt + tokens.completion

    def take(self) -> dict[str, ModelVersions]:
        """The counts since the last call, per model (``IdleMap.versions``), removed."""
        with self._lock:
            taken, self._counts = self._counts, {}
        by_model: dict[str, dict[str, VersionCounts]] = {}
        for (model, version), (requests, errors, tokens, seconds, answered) in taken.items():
            by_model.setdefault(model, {})[version] = VersionCounts(
                requests=min(requests, _BIG), errors=min(errors, _BIG),
                tokens=min(tokens, _MAX_TOKENS), first_byte_s=min(seconds, _MAX_SECONDS),
                answered=min(answered, _BIG))
        return {model: ModelVersions(**counts) for model, counts in by_model.items()}

    def put_back(self, taken: dict[str, ModelVersions]) -> None:
        """Counts :meth:`take` gave that did not reach the control service: posted with
        the next ones."""
        with self._lock:
            for model, versions in taken.items():
                for version in (STABLE, CANARY):
                    c: VersionCounts = getattr(versions, version)
                    if not (c.requests or c.answered or c.tokens):
                        continue
                    row = self._row(model, version)
                    row[0] += c.requests
                    row[1] += c.errors
                    row[2] += c.tokens
                    row[3] += c.first_byte_s
                    row[4] += c.answered


class VersionTap:
    """What one request of a canary's version did: counted once when it ends."""

    __slots__ = ("_book", "model", "version", "_started", "_first", "_ended", "_status",
                 "_stream")

    def __init__(self, book: VersionBook, model: str, version: str, started: float) -> None:
        self._book = book
        self.model = model
        self.version = version
        self._started = started
        self._first = False
        self._ended = False
        self._status = 0
        self._stream: Stream | None = None

    def failed(self) -> None:
        """The router could not get an answer from the version (an error of it)."""
        self._end(True)

    def tokens(self, tokens: Tokens | None) -> None:
        self._book.tokens(self.model, self.version, tokens)

    def watch(self, answer: Answered) -> Answered:
        """``answer``, counted: a whole one now, a stream at its first byte and its close
        (a stream the engine broke off is an error; one its client left is not)."""
        self._status = answer.status
        body = answer.body
        if isinstance(body, Stream):
            self._stream = body
            body.first_byte = self._first_byte
            body.on_close(self._closed)
        else:
            self._first_byte()
            self._end(answer.status >= 500)
        return answer

    def _first_byte(self) -> None:
        if not self._first:
            self._first = True
            self._book.first_byte(self.model, self.version,
                                  max(0.0, time.perf_counter() - self._started))

    def _closed(self) -> None:
        stream = self._stream
        self._end(self._status >= 500 or (stream is not None and stream.outcome == "broken"))

    def _end(self, error: bool) -> None:
        if not self._ended:
            self._ended = True
            self._book.ended(self.model, self.version, error)
