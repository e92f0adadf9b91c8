"""The routes table as one pure function: ``routes_of(models, nodes, replicas, keys, now,
backoff)`` -> :class:`~llmgw_runtime.api.router.Routes`, what every router routes by.

No I/O and no clock: the rows (what the store holds) and ``now`` (the store's clock) are
passed in; ``control/fleet.routes`` reads them. Each model's catalog part is its typed entry's
:class:`~llmgw_runtime.api.catalog.RouteFields` as they are (``to_router``); beside it come its
state (``states.model_state``), its ready endpoints, why nothing is routed, and its current
start streak; replicas that drain are no endpoints but are listed (``draining``), and a
canary's endpoints are marked with its share of the requests. An engine's error (a reason or
last error taken from its log) goes as its telling line only (``status/telling.py``, at most
``ERROR_LINE`` characters): the routers answer it to clients, and the full text stays in
`llmgw ctl status -o json` and the engine's log. The keys' part says which keys exist, and
each key's priority, scope, expiry and limits (docs/keys.md). Table-tested in
tests/control/test_routes_of.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..api.catalog import ModelSpec, to_router
from ..api.fields import clean
from ..api.router import ERROR_LINE, Endpoint, KeyLimits, RouteModel, Routes
from ..api.states import ModelState, ReplicaState
from ..engines.slots import slots_of
from ..status.telling import error_line
from ..store import accounts
from ..store.models import row_to_spec
from .drain import is_draining
from .identity import url_host
from .rollout import canary_of
from .states import model_state, start_streak

NOT_ROUTED_REASONS = ("parked", "unplaceable")    # states whose own reason says it all


def endpoints_of(spec: ModelSpec, replicas: list[Any], nodes: dict[str, Any],
                 canary: frozenset[str] = frozenset()) -> list[Endpoint]:
    """The model's wanted, ready replicas on nodes with an address, but those draining;
    ``canary``: the replicas of a canary's new version (marked so)."""
    slots = slots_of(spec)
    out = []
    for rep in replicas:
        node = nodes.get(rep.node)
        if rep.desired and rep.state == ReplicaState.READY and rep.port and node is not None \
                and node.address and not is_draining(rep):
            out.append(Endpoint(replica_id=rep.id, slots=slots, canary=rep.id in canary,
                                url=f"http://{url_host(node.address)}:{rep.port}"))
    return out


def unreachable_reason(replicas: list[Any]) -> str | None:
    """Why a model with replicas running is not routed: a router could not reach one, and
    its agent has not reported since (None: no wanted replica is unreachable)."""
    for rep in replicas:
        if rep.desired and rep.state == ReplicaState.UNREACHABLE:
            return (f"replica {rep.id} on {rep.node}: {rep.last_error}; waiting for its "
                    "agent's next report")
    return None


def route_model(row: Any, replicas: list[Any], nodes: dict[str, Any], now: float,
                backoff: tuple[float, float]) -> RouteModel:
    """One model of the table, from its ``models`` row and its replicas' rows."""
    spec = row_to_spec(row)
    state = model_state(row, replicas, now)
    percent, canary = canary_of(row, replicas)
    endpoints = endpoints_of(spec, replicas, nodes, canary)
    reason = state.reason
    if reason is not None and reason == row.last_error:       # the engine's log
        reason = error_line(reason, ERROR_LINE)
    if not endpoints and state.state not in NOT_ROUTED_REASONS:
        reason = unreachable_reason(replicas) or reason
    streak = start_streak(row, now, backoff)
    created = getattr(row, "created", None)
    return RouteModel(**to_router(spec), state=ModelState(state.state), reason=clean(reason),
                      endpoints=tuple(endpoints), engine=spec.engine,
                      draining=tuple(r.id for r in replicas if is_draining(r)),
                      canary_percent=percent if any(e.canary for e in endpoints) else 0,
                      failures=streak["failures"], last_error=error_line(streak["last_error"],
                                                                      ERROR_LINE),
                      retry_after_s=streak["retry_after_s"],
                      created=None if created is None else int(created))


def key_limits_of(row: Any) -> KeyLimits | None:
    """A key's limits for the routers (None: it has none)."""
    rpm, tpm = accounts.key_limits(row)
    if rpm is None and tpm is None:
        return None
    return KeyLimits(name=row.name.removeprefix("key:"), rpm=rpm, tpm=tpm)


def routes_of(models: Iterable[Any], nodes: dict[str, Any], replicas: Iterable[Any],
              keys: list[Any], now: float, backoff: tuple[float, float]) -> Routes:
    """The routes table: every model (``models`` rows, in their order) with its state and
    ready endpoints on ``nodes`` (rows by name), and the API keys (``api_key`` account
    rows) with what each may do. Expiries are in seconds from ``now``: the router counts
    them down on its own clock."""
    by_model: dict[str, list[Any]] = {}
    for rep in replicas:
        by_model.setdefault(rep.model, []).append(rep)
    limits = {k.token_hash: key_limits_of(k) for k in keys}
    return Routes(
        models=[route_model(m, by_model.get(m.name, []), nodes, now, backoff)
                for m in models],
        api_key_hashes=[k.token_hash for k in keys],
        key_priorities={k.token_hash: k.priority for k in keys if k.priority != "normal"},
        key_models={k.token_hash: scope for k in keys
                    if (scope := accounts.key_models(k)) is not None},
        key_expires_in_s={k.token_hash: k.expires_at - now for k in keys
                          if k.expires_at is not None},
        key_limits={h: v for h, v in limits.items() if v is not None})
