"""The waiting shell around the admission core: a request gets a replica slot before it is
forwarded, or waits for one, or is refused with a 429.

:class:`Gate` holds one :class:`.core.Admission` core per model (each with that model's
``max_queue`` and ``max_wait_s``) and this worker's share of the router's shared in-flight
counts (``tables/slots.py``). Every core call runs under the counts' lock: the other
workers' counts are read, the core sees ``slots - others`` (its *effective* slots), and
this worker's counts are written back, so no replica ever has more of this router's
requests in flight than its slots (this router's share of them, ``LLMGW_SLOT_SHARE``).
The queue bound is shared the same way (a column per model counts its waiting requests):
the core's ``max_queue`` is what the other workers' queues leave of the model's.

A queued request waits on an Event the core's ``on_decided`` sets (a gevent Event under
gevent: ``threading`` is patched), in short steps, checking that its client is still
there (``gone.py``). While this worker has waiting requests one poller (a greenlet) looks
every :data:`POLL_S` for slots other workers freed and refuses tickets past
``max_wait_s``. A slot is given back exactly once, when the answer (a stream included) ends
or its client goes away (:class:`Lease`).

Cost on the hot path (a free slot): about 30 us of CPU to admit and release one request,
prefix key, lock and metrics included (measured on these machines: 20,000 admit+release
pairs through ``tables/slots.py``'s ``SharedSlots``); ``bench/router_bench.py`` sees no
change in throughput at concurrency 64.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ...api.router import Endpoint
from ..errors import ClientGone
from ..metrics import RouterMetrics
from ..tables.homes import Homes
from ..tables.homes import for_this_process as homes_for_this_process
from ..tables.slots import SlotCounts, for_this_process, model_shares
from .core import Admission, Admitted, Priority, Queued, Rejected, Ticket
from .load import QUEUE as _QUEUE
from .load import Interval as _Interval
from .load import Reports

log = logging.getLogger(__name__)

POLL_S = 0.005           # how often a worker looks for slots other workers freed, while
                         # they hold slots its waiting requests could take
IDLE_POLL_S = 1.0        # else at most this long, until the next max_wait_s expiry
WAIT_STEP_S = 1.0        # how often a waiting request asks whether its client is there
                         # (a backstop: under gevent the client's socket wakes it at once)
_MAX_SAMPLES = 2000      # wait times kept per model between two capacity reports


class Lease:
    """One slot at ``endpoint``, held until :meth:`release` (idempotent)."""

    __slots__ = ("endpoint", "_gate", "_core", "_model", "_started", "_done", "_at_home")

    def __init__(self, endpoint: Endpoint, gate: Gate, core: Admission, model: str,
                 started: float, at_home: bool = False) -> None:
        self.endpoint = endpoint
        self._gate = gate
        self._core = core
        self._model = model
        self._started = started
        self._at_home = at_home
        self._done = False

    @property
    def at_home(self) -> bool:
        """Whether the slot is at the prefix's remembered home (its cache likely there)."""
        return self._at_home

    def release(self) -> None:
        if self._done:
            return
        self._done = True
        self._gate._release(self._core, self._model, self.endpoint.replica_id, self._started,
                            self._at_home)


class Gate(Reports):
    """Admission for every model of this worker. ``share``: (I, N) of ``LLMGW_SLOT_SHARE``.
    Its reports (the load per model, in flight per replica): ``load.py``."""

    def __init__(self, metrics: RouterMetrics, share: tuple[int, int] = (1, 1),
                 counts: SlotCounts | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 homes: Homes | None = None) -> None:
        self._metrics = metrics
        self._share = share
        self._counts = counts if counts is not None else for_this_process()
        # where prefixes were served last, all workers (read and written under the lock)
        self._homes = homes if homes is not None else homes_for_this_process()
        self._clock = clock
        self._cores: dict[str, Admission] = {}
        self._replicas: dict[str, tuple[str, ...]] = {}     # model -> replicas last seen
        self._slots: dict[str, dict[str, int]] = {}          # model -> this router's slots
        self._shares: dict[tuple[Endpoint, ...], dict[str, int]] = {}
        self._endpoints: dict[str, dict[str, Endpoint]] = {}
        self._interval: dict[str, _Interval] = {}
        self._queued_at: dict[str, dict[int, float]] = {}   # model -> waiting ticket -> since
        self._at_once: dict[str, Any] = {}    # model -> its admitted{how="at_once"} child
        self._max_queue: dict[str, int] = {}     # the catalog's; the core's is what is left
        self._waiting = 0
        self._poller: threading.Thread | None = None
        self._draining: Collection[str] = frozenset()   # replicas no request may take

    # -- the request path ---------------------------------------------------------------

    def admit(self, model: str, endpoints: Sequence[Endpoint], key_id: str,
              priority: Priority, prefix: bytes | None, max_queue: int, max_wait_s: float,
              gone: Callable[[], bool] = lambda: False,
              only: frozenset[str] | None = None,
              watch: Callable[[Callable[[], None]], Callable[[], None]] | None = None
              ) -> Lease | None:
        """A slot at one of ``endpoints`` (the model's usable ones; ``only``: those of them
        this request may take, a canary's version), waiting for it when every slot is
        taken; None when there is no replica (the caller waits for the model). A replica
        the routes table says drains takes none (a route read before that table came
        may still list it). Raises ModelAtCapacity (queue full, waited too long) or
        ClientGone: ``gone`` asks whether the client is still there, every
        :data:`WAIT_STEP_S` and whenever ``watch`` (given the waiter's wake-up) says its
        socket turned readable."""
        if self._draining:
            draining = self._draining
            endpoints = [e for e in endpoints if e.replica_id not in draining]
        core = self._core(model, max_queue, max_wait_s)
        shares = self._shares_of(model, endpoints)
        counts = self._counts
        now = self._clock()
        queue = _QUEUE + model
        with counts.locked():
            rids = self._replicas[model]
            *others, others_waiting = counts.others((*rids, queue))
            effective = {rid: max(0, shares[rid] - other)
                         for rid, other in zip(rids, others, strict=True)}
            # the queue bound is the router's: what the other workers' queues leave
            core.max_queue = max(0, max_queue - others_waiting)
            core.others = dict(zip(rids, others, strict=True))
            decision = core.try_admit(model, key_id, priority, effective, now, prefix, only)
            self._sync(core, model, rids)
            if isinstance(decision, Admitted):
                self._note_busy(model, sum(others) + sum(map(core.in_flight, rids)))
        if isinstance(decision, Admitted):
            at_once = self._at_once.get(model)
            if at_once is None:    # labels() costs microseconds: once per model
                at_once = self._at_once[model] = self._metrics.admitted.labels(model,
                                                                               "at_once")
            at_once.inc()
            return Lease(self._endpoints[model][decision.replica], self, core, model, now,
                         decision.at_home)
        if isinstance(decision, Queued):
            return self._wait(core, model, decision.ticket, gone, watch)
        return self._refused(core, model, decision)

    def _wait(self, core: Admission, model: str, ticket: Ticket, gone: Callable[[], bool],
              watch: Callable[[Callable[[], None]], Callable[[], None]] | None
              ) -> Lease | None:
        event = threading.Event()
        ticket.waiter = event
        if ticket.outcome is not None:
            event.set()
        self._waiting += 1
        self._interval.setdefault(model, _Interval()).queued += 1
        self._queued_at.setdefault(model, {})[ticket.id] = ticket.enqueued_at
        self._metrics.queue_depth.labels(model).inc()
        self._ensure_poller()
        unwatch = watch(event.set) if watch is not None else None
        try:
            while ticket.outcome is None:
                event.wait(WAIT_STEP_S)
                event.clear()     # an outcome set before this is seen just below
                if ticket.outcome is None and gone():
                    with self._counts.locked():
                        core.cancel(ticket, self._clock())
                        self._sync(core, model, self._replicas.get(model, ()))
                    self._metrics.rejected.labels(model, "client_gone").inc()
                    raise ClientGone(f"the client went away while its request for model "
                                     f"'{model}' waited for a slot")
        except BaseException:    # killed while waiting (worker stopping): leave the queue
            if not ticket.cancelled:
                with self._counts.locked():
                    core.cancel(ticket, self._clock())
                    self._sync(core, model, self._replicas.get(model, ()))
            raise
        finally:
            if unwatch is not None:
                unwatch()
            self._waiting -= 1
            self._queued_at.get(model, {}).pop(ticket.id, None)
            waited = self._clock() - ticket.enqueued_at
            self._metrics.queue_depth.labels(model).dec()
            self._metrics.queue_wait.labels(model).observe(waited)
            stats = self._interval.setdefault(model, _Interval())
            if len(stats.waits) < _MAX_SAMPLES:
                stats.waits.append(waited)
        outcome = ticket.outcome
        if isinstance(outcome, Admitted):
            self._metrics.admitted.labels(model, "after_wait").inc()
            with self._counts.locked():
                self._note_busy(model, sum(self._counts.totals(self._replicas.get(model,
                                                                                   ()))))
            endpoint = self._endpoints.get(model, {}).get(outcome.replica)
            if endpoint is None:     # its replica left the routes table while it waited
                self._release(core, model, outcome.replica, self._clock(), outcome.at_home)
                return None          # the caller looks at the table again
            return Lease(endpoint, self, core, model, self._clock(), outcome.at_home)
        assert isinstance(outcome, Rejected)
        return self._refused(core, model, outcome)

    def _refused(self, core: Admission, model: str, decision: Rejected) -> Lease | None:
        """None for no_replicas (the caller waits for the model); raises the 429 else."""
        if decision.reason == "no_replicas":
            return None
        self._metrics.rejected.labels(model, decision.reason).inc()
        self._interval.setdefault(model, _Interval()).rejected += 1
        raise self._at_capacity(core, model, decision)

    def _release(self, core: Admission, model: str, replica: str, started: float,
                 at_home: bool = False) -> None:
        now = self._clock()
        with self._counts.locked():
            core.release(replica, now, now - started, at_home)
            rids = self._replicas.get(model, ())
            self._sync(core, model, rids if replica in rids else (*rids, replica))

    # -- inside ---------------------------------------------------------------------------

    def _note_busy(self, model: str, held: int) -> None:
        """A request of ``model`` was admitted with ``held`` slots of its replicas taken
        by the router's requests (all workers): the interval's count and peak."""
        stats = self._interval.get(model)
        if stats is None:
            stats = self._interval[model] = _Interval()
        stats.admitted += 1
        if held > stats.busy:
            stats.busy = held

    def _core(self, model: str, max_queue: int, max_wait_s: float) -> Admission:
        core = self._cores.get(model)
        if core is None:
            core = self._cores[model] = Admission(max_queue=max_queue, max_wait_s=max_wait_s,
                                                  on_decided=_wake)
            core.homes = self._homes
        self._max_queue[model] = max_queue
        core.max_wait_s = max_wait_s
        return core

    def _shares_of(self, model: str, endpoints: Sequence[Endpoint]) -> dict[str, int]:
        """This router's slots at each endpoint (cached per endpoint set)."""
        key = tuple(endpoints)
        shares = self._shares.get(key)
        if shares is None:
            if len(self._shares) > 1000:
                self._shares.clear()
            index, count = self._share
            shares = self._shares[key] = model_shares(
                {e.replica_id: e.slots for e in endpoints}, index, count)
        if self._slots.get(model) is not shares:
            self._slots[model] = shares
            self._replicas[model] = tuple(shares)
            # kept across changes: a ticket may be admitted to a replica of an earlier set
            self._endpoints.setdefault(model, {}).update((e.replica_id, e) for e in endpoints)
        return shares

    def _sync(self, core: Admission, model: str, rids: Sequence[str]) -> None:
        """This worker's counts := the core's: in flight per replica, and its queue of the
        model (under the lock)."""
        for rid in rids:
            self._counts.set_mine(rid, core.in_flight(rid))
        self._counts.set_mine(_QUEUE + model, core.waiting(model))

    def _ensure_poller(self) -> None:
        if self._poller is None or not self._poller.is_alive():
            self._poller = threading.Thread(target=self._poll_loop, daemon=True,
                                            name="llmgw-router-admission")
            self._poller.start()

    def _poll_loop(self) -> None:
        """Polls while requests wait: every :data:`POLL_S` while another worker holds a slot
        they could take, else at the next ``max_wait_s`` expiry (at most
        :data:`IDLE_POLL_S`; this worker's own releases wake its waiters at once). 200
        wake-ups a second cost an engine on the same cores about 2 % of its speed
        (docs/performance.md)."""
        pause = POLL_S
        while self._waiting > 0:
            time.sleep(pause)
            try:
                pause = self.poll()
            except Exception:  # a bug here must not leave requests waiting forever
                log.exception("admission poll failed; trying again")
                pause = POLL_S

    def poll(self) -> float:
        """Hand slots other workers freed to this worker's waiting tickets, and refuse
        those past ``max_wait_s``; how long the poller may sleep before the next poll."""
        counts = self._counts
        now = self._clock()
        others_hold = False
        pause = IDLE_POLL_S
        with counts.locked():
            for model, core in self._cores.items():
                if not core.waiting(model):
                    continue
                rids = self._replicas.get(model, ())
                shares = self._slots.get(model, {})
                others = counts.others(rids)
                others_hold = others_hold or any(others)
                core.others = dict(zip(rids, others, strict=True))
                core.update(model, {rid: max(0, shares[rid] - other)
                                    for rid, other in zip(rids, others, strict=True)}, now)
                core.expire(now)
                self._sync(core, model, rids)
                since = self._queued_at.get(model)
                if since:
                    pause = min(pause, min(since.values()) + core.max_wait_s - now)
        return POLL_S if others_hold else max(POLL_S, pause)

    def locked(self) -> AbstractContextManager[Any]:
        """The slot counts' lock, shared by the router's workers: the router's other shared
        tables (tables/homes.py, tables/limits.py) are read and written under it too."""
        return self._counts.locked()

    def routes(self, endpoints: Callable[[str], Sequence[Endpoint]],
               draining: Collection[str]) -> None:
        """A routes table came: ``endpoints(model)``, a model's usable ones (a draining
        replica is not one), and the ``draining`` replicas. Requests waiting for a slot
        of a model take the endpoints it has now: one that drains or left is not waited
        for; when none is left they are handed back (the caller waits for the model as
        for one starting: its replacement, say)."""
        self._draining = frozenset(draining)
        now = self._clock()
        for model, core in self._cores.items():
            if not core.waiting(model):
                continue                 # the next request of the model brings them
            shares = self._shares_of(model, endpoints(model))
            rids = self._replicas[model]
            with self._counts.locked():
                others = self._counts.others(rids)
                core.update(model, {rid: max(0, shares[rid] - other)
                                    for rid, other in zip(rids, others, strict=True)}, now)
                self._sync(core, model, rids)

    def forget_except(self, replica_ids: set[str]) -> None:
        """The routes table changed: columns of replicas that left it may be reused
        (a draining replica is still in it: its requests are counted until they end)."""
        with self._counts.locked():
            self._counts.forget_except(replica_ids)
        for endpoints in self._endpoints.values():
            for rid in [r for r in endpoints if r not in replica_ids]:
                del endpoints[rid]

    # -- reading ------------------------------------------------------------------------

    def slots_in_use(self, replicas: Mapping[str, Sequence[str]]) -> dict[str, int]:
        """Model -> slots of its replicas (``replicas``: model -> replica ids, from the
        routes table) this router's requests hold now, all workers: read at scrape time
        from the shared counts, nothing is counted on the request path."""
        with self._counts.locked():
            return {model: sum(self._counts.totals(rids)) for model, rids in replicas.items()}


def _wake(ticket: Ticket) -> None:
    if ticket.waiter is not None:
        ticket.waiter.set()
