"""The routes table, table-tested on the pure ``routes_of``: which replicas are endpoints,
why a model with none is not routed, parked and on-demand models, the start streak, what
each API key may do, and the catalog's routing fields carried as the typed entry has them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw_runtime.api.catalog import MaxTokens, ModelSpec, Profile, to_router
from llmgw_runtime.api.router import ERROR_LINE, Endpoint, KeyLimits, RouteModel, Routes
from llmgw_runtime.control.routes import routes_of
from llmgw_runtime.store.models import spec_to_row

from .test_decide import NOW, model, node, replica

BACKOFF = (5.0, 300.0)
HASH_A, HASH_B, HASH_C = "a" * 64, "b" * 64, "c" * 64


def entry(name: str = "m", row: dict[str, Any] | None = None, **fields: Any) -> Any:
    """A ``models`` row of a catalog entry with ``fields`` (as the store writes it), then
    the fleet's state of it (``row``)."""
    spec = ModelSpec(name=name, source=f"/m/{name}.gguf", engine="llama.cpp",
                     profile=Profile.model_validate({"class": "cpu"}), **fields)
    return model(name, **spec_to_row(spec), **(row or {}))


def key(token_hash: str, name: str = "app", **kw: Any) -> SimpleNamespace:
    """An ``api_key`` account row: normal priority, every model, no expiry, no limits."""
    row = dict(name=f"key:{name}", token_hash=token_hash, priority="normal", models=None,
               expires_at=None, rpm=None, tpm=None)
    row.update(kw)
    return SimpleNamespace(**row)


def table(models: Sequence[Any], nodes: Sequence[Any] = (), replicas: Sequence[Any] = (),
          keys: Sequence[Any] = ()) -> Routes:
    return routes_of(models, {n.name: n for n in nodes}, replicas, list(keys), NOW, BACKOFF)


def one(models: Sequence[Any], nodes: Sequence[Any] = (), replicas: Sequence[Any] = ()
        ) -> RouteModel:
    [routed] = table(models, nodes, replicas).models
    return routed


def url(rid: str, routed: RouteModel) -> list[str]:
    return [e.url for e in routed.endpoints if e.replica_id == rid]


# ------------------------------------------------------------------ endpoints


@pytest.mark.parametrize("rep,nodes,expected", [
    (replica(), [node()], ["http://127.0.0.1:4000"]),                      # ready: routed
    (replica(state="starting"), [node()], []),                              # not yet
    (replica(desired=0), [node()], []),                                     # being stopped
    (replica(port=None), [node()], []),                                     # no port known
    (replica(), [node(address=None)], []),                                  # no address
    (replica(), [], []),                                                    # node deleted
    (replica(node_="v6"), [node("v6", address="fd00::5")], ["http://[fd00::5]:4000"]),
])
def test_only_wanted_ready_replicas_on_an_addressed_node_are_endpoints(
        rep: Any, nodes: list[Any], expected: list[str]) -> None:
    routed = one([entry()], nodes, [rep])
    assert url(rep.id, routed) == expected


def test_an_endpoint_carries_the_replicas_slots_from_the_catalog() -> None:
    routed = one([entry(slots=4)], [node()], [replica()])
    assert routed.endpoints == (Endpoint(replica_id="r-1", url="http://127.0.0.1:4000",
                                         slots=4),)
    assert routed.state == "ready" and routed.reason is None and routed.engine == "llama.cpp"


def test_each_model_gets_only_its_own_replicas_in_catalog_order() -> None:
    routes = table([entry("a"), entry("b")], [node()],
                   [replica("r-b", "b", port=4001), replica("r-a", "a")])
    assert [(m.name, [e.replica_id for e in m.endpoints]) for m in routes.models] == [
        ("a", ["r-a"]), ("b", ["r-b"])]


# ------------------------------------------------------------------ why nothing is routed


@pytest.mark.parametrize("row,reps,state,reason", [
    # a router could not reach the only replica, and its agent has not reported since
    ({}, [replica(state="unreachable", last_error="connection refused")], "starting",
     "replica r-1 on n1: connection refused; waiting for its agent's next report"),
    # a ready replica beside it: routed, no reason
    ({}, [replica(state="unreachable", last_error="refused"), replica("r-2", port=4001)],
     "ready", None),
    # parked: its own reason, even with an unreachable replica left
    ({"parked": 1, "last_error": "CUDA out of memory"},
     [replica(state="unreachable", last_error="refused")], "parked", "CUDA out of memory"),
    ({"parked": 1}, [], "parked", "too many failed starts"),
    ({"placement_reason": "no cpu device free"}, [], "unplaceable", "no cpu device free"),
    ({}, [replica(state="pending")], "starting", None),
])
def test_a_model_that_is_not_routed_says_why(row: dict[str, Any], reps: list[Any],
                                             state: str, reason: str | None) -> None:
    routed = one([entry(row=row)], [node()], reps)
    assert (routed.state, routed.reason) == (state, reason)


def test_a_reason_with_control_characters_is_made_printable() -> None:
    routed = one([entry(row={"parked": 1, "last_error": "bad\x1b[31m gguf"})])
    assert routed.reason == "bad?[31m gguf"


# An engine's log as the agent reports a failed start: 1.7 KB, the cause in the middle.
ENGINE_LOG = "\n".join([
    "engine exited with code 1; last log lines:",
    "--- llmgw: starting r-9 (m) at Thu Dec  3 19:33:00 2026: /usr/bin/llama-server "
    "--model /m/m.gguf --host 127.0.0.1 --port 40123 --alias m",
    *[f"0.00.00{i}.100 I llama_model_loader: - kv {i:2}: general.field str = value"
      for i in range(20)],
    "0.00.005.504 E gguf_init_from_reader: invalid magic characters: 'garb', expected 'GGUF'",
    "0.00.005.964 E srv    load_model: failed to load model, '/m/m.gguf'",
    "0.00.006.262 E srv          init: exiting due to model loading error"])
TELLING = ("engine exited with code 1: gguf_init_from_reader: invalid magic characters: "
           "'garb', expected 'GGUF'")


@pytest.mark.parametrize("row", [
    {"parked": 1, "consecutive_failures": 5, "last_failure_at": NOW - 1,
     "last_error": ENGINE_LOG},
    {"consecutive_failures": 2, "last_failure_at": NOW - 1, "last_error": ENGINE_LOG},
])
def test_an_engines_log_goes_to_the_routers_as_its_telling_line(row: dict[str, Any]) -> None:
    assert len(ENGINE_LOG) > 1500
    routed = one([entry(row=row)], [node()])
    assert routed.last_error == TELLING
    assert routed.reason in (TELLING, None)          # parked: its reason; starting: none
    long = one([entry(row=dict(row, last_error="error: " + "x" * 2000))], [node()])
    assert long.last_error is not None and len(long.last_error) == ERROR_LINE
    assert "\n" not in long.last_error and long.last_error.endswith("…")


def test_created_is_when_the_model_was_first_applied() -> None:
    assert one([entry(row={"created": 1_700_000_123.7})]).created == 1_700_000_123


# ------------------------------------------------------------------ on demand, start streak


@pytest.mark.parametrize("row,state,failures", [
    ({"activated_at": None}, "idle", 0),                                     # nobody asked
    ({"activated_at": NOW - 5}, "activating", 0),
    # failures from before it was last activated are no reason to refuse its wake-up
    ({"activated_at": NOW - 5, "consecutive_failures": 2, "last_failure_at": NOW - 60},
     "activating", 0),
    ({"activated_at": NOW - 60, "consecutive_failures": 2, "last_failure_at": NOW - 5,
      "last_error": "oom"}, "activating", 2),
])
def test_an_on_demand_model_is_routed_by_its_activation(row: dict[str, Any], state: str,
                                                        failures: int) -> None:
    routed = one([entry(on_demand=True, replicas=0, row=row)], [node()])
    assert routed.on_demand is True and routed.endpoints == ()
    assert (routed.state, routed.failures) == (state, failures)


@pytest.mark.parametrize("row,failures,last_error,retry_after_s", [
    ({}, 0, None, None),
    ({"consecutive_failures": 1, "last_failure_at": NOW - 2, "last_error": "oom"},
     1, "oom", 3.0),                                                        # 5 s backoff
    ({"consecutive_failures": 3, "last_failure_at": NOW - 30, "last_error": "oom"},
     3, "oom", 0.0),                                                        # 20 s: over
])
def test_the_current_start_streak_is_carried(row: dict[str, Any], failures: int,
                                             last_error: str | None,
                                             retry_after_s: float | None) -> None:
    routed = one([entry(row=row)], [node()])
    assert (routed.failures, routed.last_error, routed.retry_after_s) == (
        failures, last_error, retry_after_s)


# ------------------------------------------------------------------ keys


def test_each_key_says_its_priority_scope_expiry_and_limits() -> None:
    keys = [key(HASH_A, "plain"),
            key(HASH_B, "vip", priority="high", models=json.dumps(["a", "b"]),
                expires_at=NOW + 90, rpm=60),
            key(HASH_C, "old", priority="low", expires_at=NOW - 10, tpm=1000)]
    routes = table([], keys=keys)
    assert routes.api_key_hashes == [HASH_A, HASH_B, HASH_C]
    assert routes.key_priorities == {HASH_B: "high", HASH_C: "low"}     # normal: absent
    assert routes.key_models == {HASH_B: ["a", "b"]}                     # all: absent
    assert routes.key_expires_in_s == {HASH_B: 90.0, HASH_C: -10.0}      # expired: <= 0
    assert routes.key_limits == {HASH_B: KeyLimits(name="vip", rpm=60, tpm=None),
                                 HASH_C: KeyLimits(name="old", rpm=None, tpm=1000)}


def test_no_keys_is_an_empty_table_of_keys() -> None:
    assert table([entry()]).to_json() | {"models": []} == {
        "models": [], "api_key_hashes": [], "key_priorities": {}, "key_models": {},
        "key_expires_in_s": {}, "key_limits": {}}


# ------------------------------------------------------------------ the catalog's part


def test_the_routing_fields_are_the_typed_entrys_as_they_are() -> None:
    spec_fields: dict[str, Any] = dict(
        aliases=("chat", "chat-latest"), fallback=("small",), routing="least-outstanding",
        max_queue=5, max_wait_s=2.5, max_tokens=MaxTokens(default=256, max=1024, clamp=True))
    row = entry("big", **spec_fields)
    routed = one([row], [node()], [replica(model_="big")])
    spec = ModelSpec(name="big", source="/m/big.gguf", engine="llama.cpp",
                     profile=Profile.model_validate({"class": "cpu"}), **spec_fields)
    assert {name: getattr(routed, name) for name in to_router(spec)} == to_router(spec)
    sent = table([row], [node()], [replica(model_="big")]).to_json()["models"][0]
    assert sent["aliases"] == ["chat", "chat-latest"] and sent["fallback"] == ["small"]
    assert sent["max_tokens"] == {"default": 256, "max": 1024, "clamp": True}


def test_every_field_the_routers_read_is_sent_even_when_empty() -> None:
    [sent] = table([entry()]).to_json()["models"]
    assert sent == {"name": "m", "on_demand": False, "routing": "prefix-affinity",
                    "max_queue": 100, "max_wait_s": 30.0, "aliases": [], "fallback": [],
                    "max_tokens": None, "state": "starting", "reason": None,
                    "endpoints": [], "failures": 0, "last_error": None,
                    "retry_after_s": None, "engine": "llama.cpp", "draining": [],
                    "canary_percent": 0, "created": None}
