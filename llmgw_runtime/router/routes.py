"""The routes table: what the control service says each model's state and endpoints are.

A per-worker :class:`RoutesCache` polls ``GET /api/v1/routes`` every tick from a background
thread (a greenlet under gevent), started lazily on the first request so that it lives in
the worker, after gevent has patched. It keeps the last good table while control is
unreachable and, once a tick, posts the replicas this worker could not connect to and the
idle map, with the models found at capacity (admission), then runs ``on_tick`` (the usage
report, usage.py); requests never wait on those posts.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import pydantic

from ..api.parse import problems
from ..api.router import (
    ActivateAnswer,
    ActivateRequest,
    IdleMap,
    ModelCapacity,
    ModelVersions,
    RouteModel,
    Routes,
    Unreachable,
)
from ..api.transport import RemoteError, Transport
from ..api.usage import UsageAck, UsageReport
from ..errors import LlmgwError
from .tables.limits import KeyLimit
from .tables.slots import FILE_ENV, stable_hash

M = TypeVar("M", bound=pydantic.BaseModel)

log = logging.getLogger(__name__)
_PROCESS_ID = secrets.token_hex(6)


def router_instance() -> str:
    """Which router this process belongs to, the same for every worker of one router and
    new at each start: the host and the router's own shared-counts file (``serve.run``
    makes one per start, before the workers fork); a process serving alone has its own.
    The control service sums load over routers, not over one router's workers."""
    shared = os.environ.get(FILE_ENV)
    if not shared:
        return "rt-" + _PROCESS_ID
    return f"rt-{stable_hash(socket.gethostname() + ':' + shared):016x}"


class VersionSource(Protocol):
    """A canary's counts per model and version since the last post (``canary.py``)."""

    def take(self) -> dict[str, ModelVersions]: ...

    def put_back(self, taken: dict[str, ModelVersions]) -> None: ...


@dataclass(frozen=True)
class RoutesTable:
    models: dict[str, RouteModel]   # the messages as control sent them (urls normalised)
    api_key_hashes: frozenset[str]
    fetched_at: float
    first_seen: dict[str, int] = field(default_factory=dict)  # model -> Unix s, for "created"
    key_priorities: dict[str, str] = field(default_factory=dict)  # key hash -> high/low
    key_models: dict[str, frozenset[str]] = field(default_factory=dict)  # hash -> its scope
    key_expiry: dict[str, float] = field(default_factory=dict)  # hash -> time.monotonic()
    aliases: dict[str, str] = field(default_factory=dict)   # alias -> model name
    key_limits: dict[str, KeyLimit] = field(default_factory=dict)  # hash -> rpm, tpm

    def canonical(self, name: str) -> str:
        """The model a client's ``model`` names: itself, or the model it is an alias of."""
        return self.aliases.get(name, name)

    def may_use(self, key_id: str, model: str) -> bool:
        """Whether the key ``key_id`` (its hash) may use ``model`` (its scope)."""
        scope = self.key_models.get(key_id)
        return scope is None or model in scope

    def expired(self, key_id: str) -> bool:
        deadline = self.key_expiry.get(key_id)
        return deadline is not None and time.monotonic() >= deadline

    def replica_ids(self) -> set[str]:
        """Every replica the router keeps books of: the endpoints, and the draining
        replicas (no new request goes to them; what they have in flight is counted and
        posted until they leave the table)."""
        return {e.replica_id for m in self.models.values() for e in m.endpoints} \
            | self.draining_ids()

    def draining_ids(self) -> set[str]:
        return {rid for m in self.models.values() for rid in m.draining}


def parse_table(doc: Any, now: float, previous: RoutesTable | None = None) -> RoutesTable:
    """A :class:`RoutesTable` from control's answer (parsed as ``api.router.Routes``);
    raises ValueError naming what is wrong with it."""
    if not isinstance(doc, Routes):
        try:
            doc = Routes.model_validate(doc)
        except pydantic.ValidationError as exc:
            raise ValueError("the routes answer is malformed: "
                             + "; ".join(problems(exc)[:5])) from None
    models = {m.name: _without_trailing_slash(m) for m in doc.models}
    hashes = frozenset(doc.api_key_hashes)
    old = previous.first_seen if previous else {}
    first_seen = {name: old.get(name, int(now)) for name in models}
    mono = time.monotonic()
    # An alias names one model (the catalog refuses clashes; a table that has one anyway
    # keeps model names first, then the first model listing the alias).
    aliases: dict[str, str] = {}
    for m in doc.models:
        for alias in m.aliases:
            if alias not in models:
                aliases.setdefault(alias, m.name)
    return RoutesTable(models, hashes, now, first_seen, dict(doc.key_priorities),
                       {h: frozenset(names) for h, names in doc.key_models.items()},
                       {h: mono + left for h, left in doc.key_expires_in_s.items()},
                       aliases,
                       key_limits={h: KeyLimit(lim.name, lim.rpm, lim.tpm)
                                   for h, lim in doc.key_limits.items()})


def _without_trailing_slash(m: RouteModel) -> RouteModel:
    """``m`` itself, or when an endpoint's URL ends in "/" (the table allows it) a copy
    with that URL without it: the router appends the path to the URL as it is."""
    if not any(e.url.endswith("/") for e in m.endpoints):
        return m
    eps = tuple(e.model_copy(update={"url": e.url.rstrip("/")}) if e.url.endswith("/")
                else e for e in m.endpoints)
    return m.model_copy(update={"endpoints": eps})


class ControlError(Exception):
    """Control could not be reached or answered badly; the message says how."""


class ControlRefused(ControlError):
    """Control refused the message itself (400): sending it again would not help."""


class ControlClient:
    """The router's calls to the control service, authenticated with the router token
    (over the one transport, ``api.transport``)."""

    def __init__(self, base_url: str, token: str, timeout_s: float = 10.0,
                 ca_file: str = "", keys_optional: bool = False) -> None:
        self.keys_optional = keys_optional     # said in every idle map (IdleMap)
        self._transport = Transport(base_url, token, ca_file=ca_file or None,
                                    timeout_s=timeout_s, connect_timeout_s=min(timeout_s, 3.0),
                                    maxsize=16)
        self._base = self._transport.base
        self._router = router_instance()
        # this worker process, for its life: the control service hears each worker's
        # in-flight counts apart (a draining replica waits for every one to say none)
        self.worker = f"w-{os.getpid()}-{secrets.token_hex(3)}"

    def _call(self, method: str, path: str, body: Any, answer: type[M]) -> M:
        try:
            return self._transport.call(method, path, body, answer=answer)
        except RemoteError as exc:
            raise ControlError(f"control service answered {method} {path} with HTTP "
                               f"{exc.status}: {exc.message[:200]}"
                               + (" (is LLMGW_ROUTER_TOKEN the cluster's router token?)"
                                  if exc.status in (401, 403) else "")) from None
        except LlmgwError as exc:
            raise ControlError(str(exc)[:500]) from None

    def get_routes(self) -> Routes:
        return self._call("GET", "/api/v1/routes", None, Routes)

    def activate(self, model: str) -> dict[str, Any]:
        answer = self._call("POST", "/api/v1/activate", ActivateRequest(model=model),
                            ActivateAnswer)
        return answer.model_dump(mode="json")

    def post_unreachable(self, replica_id: str, reason: str) -> None:
        try:
            self._transport.request("POST", "/api/v1/unreachable",
                                    Unreachable(replica_id=replica_id, reason=reason))
        except LlmgwError as exc:
            raise ControlError(f"unreachable replica not accepted: {str(exc)[:300]}"
                               ) from None

    def post_usage(self, report: UsageReport) -> bool:
        """Post a usage report; whether it was applied now (False: it was before)."""
        try:
            return self._transport.call("POST", "/api/v1/usage", report,
                                        answer=UsageAck).applied
        except RemoteError as exc:
            kind = ControlRefused if exc.status == 400 else ControlError
            raise kind(f"control service answered POST /api/v1/usage with HTTP "
                       f"{exc.status}: {exc.message[:300]}") from None
        except LlmgwError as exc:
            raise ControlError(f"usage report not delivered: {str(exc)[:300]}") from None

    def post_idle(self, replicas: dict[str, float],
                  capacity: dict[str, ModelCapacity] | None = None, *,
                  in_flight: dict[str, int] | None = None,
                  versions: dict[str, ModelVersions] | None = None) -> None:
        try:
            self._transport.request("POST", "/api/v1/idle",
                                    IdleMap(replicas=replicas, capacity=capacity or {},
                                            router=self._router, worker=self.worker,
                                            in_flight=in_flight or {},
                                            versions=versions or {},
                                            keys_optional=self.keys_optional))
        except LlmgwError as exc:
            raise ControlError(f"idle map not accepted: {str(exc)[:300]}") from None


class RoutesCache:
    """The last good routes table of this worker, refreshed every ``interval_s``."""

    def __init__(self, client: ControlClient, interval_s: float,
                 idle_map: Callable[[], dict[str, float]],
                 on_table: Callable[[RoutesTable], None] | None = None,
                 clock: Callable[[], float] = time.time,
                 capacity: Callable[[], dict[str, ModelCapacity]] | None = None,
                 on_tick: Callable[[], Any] | None = None,
                 in_flight: Callable[[], dict[str, int]] | None = None,
                 versions: VersionSource | None = None,
                 heartbeat_s: float | None = None) -> None:
        self._client = client
        self._heartbeat_s = heartbeat_s
        self._posted_at = -math.inf
        self._in_flight = in_flight
        self._versions = versions
        self._on_tick = on_tick
        self._capacity = capacity
        self._interval = interval_s
        self._idle_map = idle_map
        self._on_table = on_table
        self._clock = clock
        self._table: RoutesTable | None = None
        self._problem: str | None = None
        self._last_attempt = 0.0
        self._refresh_lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._unreachable: dict[str, str] = {}     # replica id -> why, posted next tick
        self._unreachable_lock = threading.Lock()

    @property
    def table(self) -> RoutesTable | None:
        return self._table

    @property
    def problem(self) -> str | None:
        """Why the last refresh failed, or None when it worked."""
        return self._problem

    def ensure_started(self) -> None:
        """Start the refresh loop in this process, once (cheap after the first call)."""
        if self._thread is not None:
            return
        with self._start_lock:
            if self._thread is None:
                thread = threading.Thread(target=self._loop, name="llmgw-router-routes",
                                          daemon=True)
                thread.start()
                self._thread = thread

    def stop(self) -> None:
        self._stop.set()

    def refresh(self, max_age_s: float = 0.0) -> RoutesTable | None:
        """Fetch the table now unless an attempt is younger than ``max_age_s``; concurrent
        callers share one fetch. Returns the last good table (maybe None)."""
        with self._refresh_lock:
            if max_age_s and self._clock() - self._last_attempt < max_age_s:
                return self._table
            table = self._fetch_locked()
        if table is not None and self._on_table is not None:
            self._on_table(table)
        return table or self._table

    def refresh_since(self, since: float, min_gap_s: float = 0.2) -> RoutesTable | None:
        """The table from a fetch that began at or after ``since`` (this cache's clock):
        what the control service said after a caller learnt something (a model it does
        not know). Concurrent callers share a fetch, and fetches begin at most every
        ``min_gap_s``, so made-up model names cannot make the router hammer the control
        service. Returns the last good table (maybe None)."""
        with self._refresh_lock:
            if self._last_attempt >= since:
                return self._table
            wait = min(min_gap_s, self._last_attempt + min_gap_s - self._clock())
            if wait > 0:
                time.sleep(wait)
            table = self._fetch_locked()
        if table is not None and self._on_table is not None:
            self._on_table(table)
        return table or self._table

    def _fetch_locked(self) -> RoutesTable | None:
        """One fetch (the refresh lock held); the new table, or None when it failed."""
        self._last_attempt = self._clock()
        try:
            doc = self._client.get_routes()
            table = parse_table(doc, self._clock(), self._table)
        except (ControlError, ValueError, KeyError, TypeError) as exc:
            self._set_problem(str(exc))
            return None
        self._table = table
        self._set_problem(None)
        return table

    def report_unreachable(self, replica_id: str, reason: str) -> None:
        """Queue ``replica_id`` for the control service (posted on the next tick)."""
        with self._unreachable_lock:
            if len(self._unreachable) < 1000:
                self._unreachable[replica_id] = reason

    def _post_unreachable(self) -> None:
        with self._unreachable_lock:
            queued, self._unreachable = self._unreachable, {}
        for replica_id, reason in queued.items():
            try:
                self._client.post_unreachable(replica_id, reason)
            except ControlError as exc:   # its agent's next report tells control anyway
                log.warning("replica %s not reported unreachable: %s", replica_id, exc)

    def _set_problem(self, problem: str | None) -> None:
        if problem == self._problem:
            return
        if problem is None:
            log.info("routes table refreshed from the control service again")
        else:
            log.warning("routes table not refreshed (%s); %s", problem,
                        "keeping the last good table" if self._table else "no table yet")
        self._problem = problem

    def tick(self) -> None:
        """One cycle: post the replicas this worker could not reach (so that the table
        fetched next leaves them out), refresh the table, then post the idle map, with
        the models found at capacity since the last post (admission), the requests in
        flight per replica and a canary's counts per version, and run ``on_tick`` (the
        usage report). The map goes every tick while a request is in flight or the table
        names a draining replica, empty or not: a draining replica stops once every
        worker said it has nothing left there; with ``heartbeat_s``, at least that often
        (a router serving without keys says so: IdleMap.keys_optional)."""
        self._post_unreachable()
        table = self.refresh()
        now = self._clock()
        idle = {rid: max(0.0, now - used) for rid, used in self._idle_map().items()}
        capacity = self._capacity() if self._capacity is not None else {}
        extra: dict[str, Any] = {}
        in_flight = self._in_flight() if self._in_flight is not None else {}
        if in_flight or (table is not None and table.draining_ids()):
            extra["in_flight"] = in_flight
        versions = self._versions.take() if self._versions is not None else {}
        if versions:
            extra["versions"] = versions
        due = self._heartbeat_s is not None and now - self._posted_at >= self._heartbeat_s
        if idle or capacity or extra or due:
            self._posted_at = now
            try:
                if capacity or extra:
                    self._client.post_idle(idle, capacity, **extra)
                else:
                    self._client.post_idle(idle)
            except ControlError as exc:
                log.debug("idle map not posted: %s", exc)
                if versions and self._versions is not None:
                    self._versions.put_back(versions)
        if self._on_tick is not None:
            self._on_tick()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            try:
                self.tick()
            except Exception:  # a bug in one cycle must not stop routing updates
                log.exception("router tick failed; trying again next tick")
            self._stop.wait(max(0.0, self._interval - (self._clock() - started)))
