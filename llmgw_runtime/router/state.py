"""What one router worker keeps and does for a proxied request before the engine answers:
the routes table, the API key check, the key's limits and usage meter, the model's
readiness (activation, honest refusals) and the forward through admission."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..api.router import ERROR_LINE, KEYS_OPTIONAL_POST_S, Endpoint, RouteModel
from ..api.states import ModelState
from ..security import PREFIXES, bearer, hash_token
from ..status.telling import error_line
from ..throttle import ROUTER, Throttle, retry_after
from .admission.affinity import prefix_key
from .admission.gate import Gate, Lease
from .admission.gone import client_gone, watch_client
from .balancer import Balancer
from .canary import VersionBook, VersionTap, pick
from .config import RouterConfig
from .errors import (
    InvalidApiKey,
    KeyRateLimited,
    ModelFailing,
    ModelNotFound,
    ModelNotReady,
    ModelParked,
    ModelStopped,
    ModelUnplaceable,
    ReplicasUnreachable,
    TooManyFailedKeys,
    UpstreamError,
)
from .metrics import RouterMetrics
from .proxy import Admit, Answered, Upstreams, upstream_headers
from .routes import (
    ControlClient,
    ControlError,
    ControlRefused,
    RoutesCache,
    RoutesTable,
)
from .tables import limits
from .tables.limits import Limiter, estimate_tokens
from .usage import KEY_ID, METER, Meter, UsageBook, UsageReporter

log = logging.getLogger(__name__)

_ROUNDS = 3     # tries of a request that found no replica to admit it (state.forward)

_ACTIVATE_STATES = (ModelState.STARTING, ModelState.ACTIVATING, ModelState.IDLE)
# Where an engine's whole log is, said after its telling line in a refusal (the agent's
# supervisor writes it: agent/supervisor.py).
FULL_LOG = ("The engine's full log is on its node: `<agent state dir>/run/<replica>.log` "
            "(`.llmgw/agent/run/` under `llmgw up`); `llmgw ctl events` names the replica "
            "and its node")


class RouterState:
    """Everything one worker keeps: the balancer, the routes cache, the upstream pools."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.metrics = RouterMetrics()
        self.balancer = Balancer()
        self.gate = Gate(self.metrics, config.slot_share_parts)
        self.metrics.slots_in_use_source = self._slots_in_use
        self.control = ControlClient(config.control_url, config.router_token,
                                     ca_file=config.ca_file,
                                     keys_optional=not config.require_api_key)
        # Per-key limits (shared by the router's workers) and usage (this worker's, posted
        # once a tick): tables/limits.py, usage.py.
        self.limiter = Limiter(limits.for_this_process(), config.slot_share_parts,
                               self.gate.locked)
        self.usage = UsageBook()
        self.usage_reporter = UsageReporter(self.usage, self.control.post_usage,
                                            retry=(ControlError,), refused=(ControlRefused,))
        self.versions = VersionBook(self.metrics)      # a canary's versions (canary.py)
        self.routes = RoutesCache(self.control, config.refresh_interval_s,
                                  self.balancer.last_used, on_table=self._on_table,
                                  capacity=self.gate.capacity,
                                  on_tick=self.usage_reporter.post,
                                  in_flight=self.gate.in_flight, versions=self.versions,
                                  heartbeat_s=None if config.require_api_key
                                  else KEYS_OPTIONAL_POST_S)
        self.upstreams = Upstreams(self.balancer, config.upstream_timeout_s,
                                   on_unreachable=self.routes.report_unreachable,
                                   max_buffered=config.max_buffered_answer_bytes)
        self._activated: dict[str, tuple[float, dict[str, Any]]] = {}
        self.key_throttle = Throttle(ROUTER)
        self._urls: dict[str, str] = {}     # replica -> url, draining replicas' kept

    def _on_table(self, table: RoutesTable) -> None:
        """A routes table came. A draining replica (listed in ``draining``, no longer an
        endpoint) stays known until it leaves the table: its requests in flight finish
        on their connections and are counted; requests waiting for a slot of a model take
        its endpoints now (or, with none left, wait for the model as for one starting)."""
        ids, draining = table.replica_ids(), table.draining_ids()
        self.balancer.forget_except(ids)
        self.gate.forget_except(ids)
        models, usable = table.models, self.balancer.usable
        self.gate.routes(lambda name: usable(models[name].endpoints) if name in models
                         else (), draining)
        urls = {e.replica_id: e.url for m in models.values() for e in m.endpoints}
        for rid in draining:
            if rid not in urls and rid in self._urls:
                urls[rid] = self._urls[rid]
        self._urls = urls
        self.upstreams.forget_except(set(urls.values()))

    def _slots_in_use(self) -> dict[str, int]:
        """For /metrics: models whose replicas have known slots, and any other model
        with requests in flight."""
        table = self.routes.table
        models = table.models.values() if table is not None else ()
        used = self.gate.slots_in_use({m.name: [e.replica_id for e in m.endpoints]
                                       for m in models if m.endpoints})
        limited = {m.name for m in models if any(e.slots for e in m.endpoints)}
        return {model: n for model, n in used.items() if n or model in limited}

    def current_table(self) -> RoutesTable:
        """The routes table; the first request of a worker fetches it if the loop has not."""
        self.routes.ensure_started()
        table = self.routes.table or self.routes.refresh(max_age_s=0.5)
        if table is None:
            raise ModelNotReady("the router has no routes table yet: "
                                f"{self.routes.problem or 'control service not reached'}. "
                                "Check that the control service runs (`llmgw ctl status`) "
                                "and that the router token is right")
        return table

    def check_api_key(self, table: RoutesTable, environ: dict[str, Any]) -> None:
        """The request's API key (``Authorization: Bearer``, or ``X-Api-Key`` as Anthropic's
        clients send it) must be one of the table's, not expired; an address that sent many
        wrong keys is refused (429, Retry-After) for a growing while before any check
        (throttle.py: per worker process, by TCP peer address, not X-Forwarded-For).

        A router that does not require keys (``require_api_key`` false, as under `llmgw
        up`) serves a request without one as the anonymous ``-``, and checks a key that is
        sent all the same: an unknown or expired one is refused, a valid one brings its
        scope, limits, priority and usage. There a value that is not an llmgw key (the
        ``api_key="none"`` an openai client must be given) counts as no key."""
        environ[KEY_ID] = "-"
        key = bearer(environ.get("HTTP_AUTHORIZATION"))
        if key is None:     # Anthropic's clients send their key as X-Api-Key
            key = environ.get("HTTP_X_API_KEY") or None
        required = self.config.require_api_key
        if not required and (key is None or not key.startswith(PREFIXES["api_key"])):
            return
        address, now = environ.get("REMOTE_ADDR") or "-", time.monotonic()
        wait = self.key_throttle.wait_s(address, now)
        if wait > 0:
            raise TooManyFailedKeys(f"too many requests with a wrong API key from your "
                                    f"address; retry after {retry_after(wait)} s with a "
                                    "valid key", retry_after_s=wait)
        if required and not table.api_key_hashes:
            raise InvalidApiKey("this router requires an API key and none is configured: "
                                "create one with `llmgw ctl keys create NAME` and send it as "
                                "`Authorization: Bearer sk-llmgw-...`")
        if key is None:
            raise InvalidApiKey("no API key: send `Authorization: Bearer <key>`; create a key "
                                "with `llmgw ctl keys create NAME`")
        key_id = environ[KEY_ID] = hash_token(key)
        if key_id not in table.api_key_hashes:
            if self.key_throttle.failed(address, now):
                log.warning("repeated wrong API keys from %s; refusing it for a while",
                            address)
            raise InvalidApiKey("the API key is not valid: use a key made with "
                                "`llmgw ctl keys create NAME` (keys are shown only once)"
                                + ("" if required else "; this router also serves requests "
                                   "without a key: send none to be served as anonymous"))
        self.key_throttle.succeeded(address)
        if table.expired(key_id):
            raise InvalidApiKey("this API key has expired: ask the operator for a new one "
                                "(`llmgw ctl keys create NAME`) or a later expiry "
                                "(`llmgw ctl keys set NAME --expires 30d`)")

    def meter(self, environ: dict[str, Any], table: RoutesTable, doc: dict[str, Any],
              body_bytes: int) -> Meter:
        """The request's usage meter, once its key's limits let it through: a key with a
        limit takes one request and its estimated tokens of this router's share now, or
        the request is refused (429 rate_limit_exceeded, Retry-After)."""
        key_id = environ.get(KEY_ID) or "-"
        limit = table.key_limits.get(key_id)
        if limit is None:
            meter = Meter(key_id, self.usage, prompt=estimate_tokens({}, body_bytes))
        else:
            estimate = estimate_tokens(doc, body_bytes) if limit.tpm is not None else 0
            verdict = self.limiter.check(key_id, limit, estimate)
            if not verdict.allowed:
                kind = verdict.refused or "requests"
                per_minute = limit.rpm if kind == "requests" else limit.tpm
                routers = self.config.slot_share_parts[1]
                flag = "--rpm" if kind == "requests" else "--tpm"
                raise KeyRateLimited(
                    f"API key '{limit.name}' is over its limit of {per_minute} {kind} per "
                    "minute" + (f" (this router lets through its share, 1/{routers}, as "
                                f"each of the {routers} routers does)" if routers > 1 else "")
                    + f"; retry after {retry_after(verdict.retry_after_s)} s, or ask the "
                    f"operator for a higher limit (`llmgw ctl keys set {limit.name} {flag} "
                    "N`)", kind=kind, retry_after_s=verdict.retry_after_s)
            meter = Meter(key_id, self.usage, self.limiter, limit, estimate,
                          prompt=estimate_tokens({}, body_bytes))
        environ[METER] = meter
        return meter

    def _activate(self, model: str) -> dict[str, Any]:
        """Ask control to start ``model``; concurrent requests share one call a second."""
        now = time.monotonic()
        cached = self._activated.get(model)
        if cached and now - cached[0] < 1.0:
            return cached[1]
        self._activated[model] = (now, {})
        try:
            answer = self.control.activate(model)
        except Exception as exc:  # control unreachable: keep waiting on the table
            log.warning("activation of %s not requested: %s", model, exc)
            answer = {}
        self._activated[model] = (now, answer)
        return answer

    def table_for(self, model: str, table: RoutesTable) -> RoutesTable:
        """``table``, or for a model it does not list a table fetched after now: a model
        added by `ctl apply` a moment ago is never answered 404 (the fetch is shared)."""
        if model in table.models:
            return table
        return self.routes.refresh_since(time.time()) or table

    def resolve(self, model: str, table: RoutesTable) -> RouteModel:
        """The model's route with at least one usable endpoint (not marked down), activating
        and waiting if needed; refused at once when parked, unplaceable or failing."""
        route = table.models.get(model)
        if route is None:
            raise ModelNotFound(f"model '{model}' is not in the catalog; GET /v1/models lists "
                                "the models this router serves", param="model")
        if self.balancer.usable(route.endpoints):
            return route
        _refuse(route.state, route.reason, model)
        _refuse_failing(model, route.failures, route.last_error, route.retry_after_s,
                        table.fetched_at)
        if route.state != ModelState.READY:   # ready, but this worker cannot reach it: wait
            answer = self._activate(model)
            _refuse(str(answer.get("state") or ""), answer.get("reason"), model)
            _refuse_failing(model, int(answer.get("failures") or 0), answer.get("last_error"),
                            answer.get("retry_after_s"), time.time())
        started = time.monotonic()
        deadline = started + self.config.activation_timeout_s
        # Ready replicas this worker cannot connect to: the control service takes them out
        # within a tick or two of hearing it; when it still lists them after that (it is
        # away, or their agent insists), the honest answer is that they failed (502).
        down_deadline = started + min(self.config.activation_timeout_s,
                                      2 * self.config.refresh_interval_s + 1.0)
        step = min(0.5, self.config.refresh_interval_s)
        fetched_at = table.fetched_at
        while time.monotonic() < deadline:
            time.sleep(max(0.0, min(step, deadline - time.monotonic())))
            current = self.routes.refresh(max_age_s=step)
            if current is not None and model in current.models:
                route, fetched_at = current.models[model], current.fetched_at
            if self.balancer.usable(route.endpoints):
                return route
            _refuse(route.state, route.reason, model)
            _refuse_failing(model, route.failures, route.last_error, route.retry_after_s,
                            fetched_at)
            if route.endpoints and time.monotonic() >= down_deadline:
                self._refuse_down(model, route)
        down = [f"{e.replica_id}: {why}" for e in route.endpoints
                if (why := self.balancer.down(e.replica_id))]
        raise ModelNotReady(f"model '{model}' has no ready replica after "
                            f"{self.config.activation_timeout_s:g} s (state: {route.state}"
                            + (f", {error_line(route.reason, ERROR_LINE)}" if route.reason
                               else "")
                            + (f"; this router could not connect to {'; '.join(down)}"
                               if down else "")
                            + "); retry later, `llmgw ctl status` shows its progress",
                            param="model")

    def _refuse_down(self, model: str, route: RouteModel) -> None:
        down = [f"{e.replica_id} ({e.url}): {why}" for e in route.endpoints
                if (why := self.balancer.down(e.replica_id))]
        raise UpstreamError(f"no replica of model '{model}' can be reached from this router: "
                            + "; ".join(down) + ". The control service still lists them as "
                            "ready; retry shortly, `llmgw ctl status` shows the replicas' "
                            "state")

    def forward(self, environ: dict[str, Any], model: str, route: RouteModel, path: str,
                body: bytes, doc: dict[str, Any], table: RoutesTable) -> Answered:
        """Proxy to the route's replicas, each request admitted to a slot first
        (admission/gate.py).
        When none could be connected to, or none was left to admit it (they drained or
        left while it waited; nothing reached an engine), wait for what the control
        service makes of it (another replica, a replacement starting, an honest refusal)
        instead of answering 502 at once. Under a canary rollout the request goes to one
        version's endpoints (canary.py), counted per version."""
        headers = upstream_headers(environ)
        admit = self._admitter(environ, model, doc, table)
        meter: Meter | None = environ.get(METER)
        if meter is not None:     # a completion stream asks the engine for its usage
            body = meter.prepare(path, doc, body)
            meter.on_tokens = None
        started = time.perf_counter()
        tap: VersionTap | None = None
        # each wait (resolve) is bounded by the activation timeout
        for attempt in range(_ROUNDS):
            slot, endpoints, version = admit(route)
            tap = None if version is None else self.versions.tap(model, version, started)
            try:
                answer = self.upstreams.forward(model, endpoints, path, body, headers, slot)
                break
            except ReplicasUnreachable:
                if attempt == _ROUNDS - 1:
                    if tap is not None:
                        tap.failed()
                    raise
            except UpstreamError:
                if tap is not None:
                    tap.failed()
                raise
            table = self.routes.refresh(max_age_s=0.1) or self.current_table()
            route = self.resolve(model, table)
        if tap is not None:
            if meter is not None:
                meter.on_tokens = tap.tokens
            answer = tap.watch(answer)
        return answer if meter is None else meter.observe(answer, model, path)

    def _admitter(self, environ: dict[str, Any], model: str, doc: dict[str, Any],
                  table: RoutesTable
                  ) -> Callable[[RouteModel], tuple[Admit, Sequence[Endpoint], str | None]]:
        """What admits this request to a slot of a route's endpoints: its API key (the
        fairness key), the key's priority, its prefix key when the model routes by
        prefix affinity, and a check that its client is still there. For a route, the
        admitter, the endpoints the request may take, and their version when a canary
        holds (canary.py: admission sees that version's endpoints only)."""
        key_id = environ.get(KEY_ID) or "-"
        priority = table.key_priorities.get(key_id, "normal")
        gate, usable = self.gate, self.balancer.usable
        keyed: list[bytes | None] = []

        def gone() -> bool:
            return client_gone(environ)

        def watch(wake: Callable[[], None]) -> Callable[[], None]:
            return watch_client(environ, wake)

        def for_route(route: RouteModel) -> tuple[Admit, Sequence[Endpoint], str | None]:
            prefix = None
            if route.routing == "prefix-affinity":
                if not keyed:
                    keyed.append(prefix_key(doc, environ.get("PATH_INFO")))
                prefix = keyed[0]
            version = pick(route, prefix, usable) if route.canary_percent else None

            def admit(endpoints: Sequence[Endpoint]) -> Lease | None:
                return gate.admit(model, endpoints, key_id, priority,  # type: ignore[arg-type]
                                  prefix, route.max_queue, route.max_wait_s, gone, None,
                                  watch)
            if version is None:
                return admit, route.endpoints, None

            def admit_version(endpoints: Sequence[Endpoint]) -> Lease | None:
                return gate.admit(model, usable(route.endpoints), key_id,
                                  priority, prefix,  # type: ignore[arg-type]
                                  route.max_queue, route.max_wait_s, gone,
                                  frozenset(e.replica_id for e in endpoints), watch)
            return admit_version, version[1], version[0]
        return for_route


def _refuse_failing(model: str, failures: int, last_error: str | None,
                    retry_after_s: float | None, fetched_at: float) -> None:
    """No ready replica and the current start streak failed: refuse now, saying why and
    when the next start may begin, instead of making the client wait on it."""
    if failures < 1:
        return
    left = max(0.0, (retry_after_s or 0.0) - max(0.0, time.time() - fetched_at))
    when = (f"The next start may begin in {math.ceil(left)} s" if left > 0
            else "The next start is under way")
    raise ModelFailing(f"model '{model}' has no ready replica ({failures} failure"
                       + ("" if failures == 1 else "s") + " in a row; last error: "
                       f"{error_line(last_error, ERROR_LINE) or 'unknown'}). {when}: retry "
                       "after the Retry-After seconds; `llmgw ctl status` shows its "
                       f"progress. {FULL_LOG}", retry_after_s=left, param="model")


def _refuse(state: str, reason: Any, model: str) -> None:
    if state == "parked":
        raise ModelParked(f"model '{model}' is parked after repeated failed starts; last error: "
                          f"{error_line(reason, ERROR_LINE) or 'unknown'}. Fix the cause, "
                          f"then run `llmgw ctl retry {model}`. {FULL_LOG}", param="model")
    if state == "unplaceable":
        raise ModelUnplaceable(f"model '{model}' cannot be placed: {reason or 'no device fits'}. "
                               "Free or add a device that fits its profile, or change the "
                               "profile in the catalog", param="model")
    if state == "stopped":
        raise ModelStopped(f"model '{model}' is stopped: it has replicas: 0 in the catalog. "
                           "An operator starts it by giving it replicas (or on_demand: true) "
                           "and running `llmgw ctl apply`", param="model")
