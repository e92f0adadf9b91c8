#!/usr/bin/env python3
"""llmgw's Grafana dashboards, written from the compact description below into
monitoring/dashboards/*.json (Grafana's dashboard JSON, schemaVersion 39: Grafana 10.4 and
later read it as it is).

    .venv/bin/python monitoring/make_dashboards.py           # write the JSON files
    .venv/bin/python monitoring/make_dashboards.py --check   # exit 1 when one differs

Edit the description here, never the JSON: tests/monitoring/test_dashboards.py fails when
the committed files differ from what this writes, or when a query names a metric no llmgw
service exports; tests/integration/test_dashboards.py runs every query against a real
Prometheus scraping a real control service and router.

Every dashboard takes its Prometheus from the ``datasource`` variable; ``$model``,
``$key``, ``$class`` and ``$node`` are multi-value variables whose "All" is ``.*``, so a
query matches them with ``=~``. The control service reports the whole fleet from each of
its instances: its gauges are taken with ``max by (...)`` (never summed across
instances); the routers' counters are summed (each router counts its own requests).

The pieces of the description (``Q``, ``Panel``, ``Row``, ``Var``, ``Dashboard``, ``ts``,
``stat``) and the JSON written from them are in dashboard_json.py, beside this script.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:     # loaded from its file (tests/monitoring/support.py), not run
    sys.path.insert(0, str(HERE))

from dashboard_json import Dashboard, Panel, Q, Row, Var, render, stat, ts  # noqa: E402

OUT = HERE / "dashboards"
RATE = "$__rate_interval"
RANGE = "$__range"
QUANTILES = (0.5, 0.9, 0.99)


# ---------------------------------------------------------------------- the description


def quantiles(metric: str, by: str, selector: str, legend: str) -> tuple[Q, ...]:
    """p50, p90 and p99 of a histogram over the rate window, per ``by``."""
    return tuple(Q(f"histogram_quantile({q:g}, sum by (le, {by}) "
                   f"(rate({metric}_bucket{{{selector}}}[{RATE}])))",
                   f"{legend} p{round(q * 100)}") for q in QUANTILES)


def fleet_max(metric: str, by: str, selector: str) -> str:
    """A control-service gauge: every control instance reports the same fleet."""
    return f"max by ({by}) ({metric}{{{selector}}})" if selector else f"max by ({by}) ({metric})"


M = 'model=~"$model"'
DEV = 'class=~"$class", node=~"$node"'
NODE = 'node=~"$node"'
KEY = 'key=~"$key", model=~"$model"'
DEVICE = "node, device, class"
# The codes the routers answer when a request's API key refuses it (docs/keys.md), as the
# routers count them by model and code (per key: llmgw_usage_refused_total).
KEY_REFUSALS = "invalid_api_key|too_many_failed_keys|rate_limit_exceeded"

MODEL_VAR = Var("model", "Model", "label_values(llmgw_model_desired_replicas, model)")


FLEET = Dashboard(
    "llmgw-fleet", "llmgw / Fleet",
    "Capacity, use and health of the llmgw fleet by device class and node (the control "
    "service's /metrics; slots from the routers').",
    (Var("class", "Device class", "label_values(llmgw_device_healthy, class)"),
     Var("node", "Node", "label_values(llmgw_node_reporting, node)")),
    (
        Row("Health"),
        stat("Control leader", "Control instances holding the reconciler lease: exactly 1 "
             "is healthy (0: nothing places or restarts replicas; alert LlmgwNoLeader).",
             Q("sum(llmgw_leader)", "leaders", instant=True)),
        stat("Nodes reporting", "Nodes that reported within LLMGW_NODE_TIMEOUT_S, of the "
             "nodes known.",
             Q(f"sum({fleet_max('llmgw_node_reporting', 'node', NODE)})", "reporting",
               instant=True),
             Q(f"count({fleet_max('llmgw_node_reporting', 'node', NODE)})", "known",
               instant=True)),
        stat("Devices healthy", "Devices healthy in their node's last report, of all "
             "devices.",
             Q(f"sum({fleet_max('llmgw_device_healthy', DEVICE, DEV)})", "healthy",
               instant=True),
             Q(f"count({fleet_max('llmgw_device_healthy', DEVICE, DEV)})", "devices",
               instant=True)),
        stat("Models in trouble", "Models parked after failed starts, that placement "
             "cannot place, or at capacity (a router refused or queued requests for every "
             "slot taken).",
             Q(f"sum({fleet_max('llmgw_model_parked', 'model', '')})", "parked",
               instant=True),
             Q(f"sum({fleet_max('llmgw_model_unplaceable', 'model', '')})", "unplaceable",
               instant=True),
             Q(f"sum({fleet_max('llmgw_model_at_capacity', 'model', '')})", "at capacity",
               instant=True)),
        ts("Replicas by state", "Every replica of the fleet by state (pending, fetching, "
           "starting, ready, failed, stopping, unreachable).",
           Q("max by (state) (llmgw_replicas)", "{{state}}"), stack=True),
        ts("Models: replicas ready and wanted", "Ready replicas against what the models "
           "want now, summed over the models.",
           Q(f"sum({fleet_max('llmgw_model_ready_replicas', 'model', '')})", "ready"),
           Q(f"sum({fleet_max('llmgw_model_desired_replicas', 'model', '')})", "wanted"),
           Q(f"sum({fleet_max('llmgw_replicas_draining', 'model', '')})", "draining")),
        Row("Capacity and use by class"),
        ts("Devices by class", "Devices of each class, and how many of them are healthy.",
           Q(f"count by (class) ({fleet_max('llmgw_device_healthy', DEVICE, DEV)})",
             "{{class}} devices"),
           Q(f"sum by (class) ({fleet_max('llmgw_device_healthy', DEVICE, DEV)})",
             "{{class}} healthy"), width=8),
        ts("Device memory by class", "Memory of each class's devices, and the memory in "
           "use on them (engines and anything else on the card).",
           Q(f"sum by (class) ({fleet_max('llmgw_device_memory_total_bytes', DEVICE, DEV)})",
             "{{class}} total"),
           Q(f"sum by (class) ({fleet_max('llmgw_device_memory_used_bytes', DEVICE, DEV)})",
             "{{class}} used"), unit="bytes", width=8),
        ts("Device memory in use by class", "Share of each class's device memory in use.",
           Q(f"sum by (class) ({fleet_max('llmgw_device_memory_used_bytes', DEVICE, DEV)})"
             f" / sum by (class) "
             f"({fleet_max('llmgw_device_memory_total_bytes', DEVICE, DEV)})", "{{class}}"),
           unit="percentunit", width=8),
        ts("Slots in use", "Engine slots the routers' requests hold now, per model, "
           "against the slots of the ready replicas of scaled models (a model with a "
           "replica range).",
           Q("sum by (model) (llmgw_router_slots_in_use)", "{{model}} in use"),
           Q(fleet_max("llmgw_model_load_slots", "model", ""), "{{model}} slots")),
        ts("Requests in flight and waiting", "Requests the routers answer now, and those "
           "waiting for a free slot, over the whole fleet.",
           Q("sum(llmgw_router_in_flight)", "in flight"),
           Q("sum(llmgw_router_queue_depth)", "waiting")),
        Row("Nodes"),
        ts("Node reporting", "1 while the node reports within LLMGW_NODE_TIMEOUT_S.",
           Q(fleet_max("llmgw_node_reporting", "node", NODE), "{{node}}"), width=8),
        ts("Seconds since each node's report", "Age of each node's last report (absent "
           "for a node that never reported).",
           Q(fleet_max("llmgw_node_last_report_age_seconds", "node", NODE), "{{node}}"),
           unit="s", width=8),
        ts("Cordoned and draining nodes", "1 while no new replica is placed on the node "
           "(ctl nodes cordon, or a drain), and while its replicas move elsewhere.",
           Q(fleet_max("llmgw_node_cordoned", "node", NODE), "{{node}} cordoned"),
           Q(fleet_max("llmgw_node_draining", "node", NODE), "{{node}} draining"), width=8),
        ts("Device memory in use", "Share of each device's memory in use.",
           Q(f"{fleet_max('llmgw_device_memory_used_bytes', DEVICE, DEV)} / "
             f"{fleet_max('llmgw_device_memory_total_bytes', DEVICE, DEV)}",
             "{{node}} {{device}}"), unit="percentunit", width=8),
        ts("Device temperature", "The card's temperature (absent for a device that does "
           "not report one, such as a CPU).",
           Q(fleet_max("llmgw_device_temperature_celsius", DEVICE, DEV),
             "{{node}} {{device}}"), unit="celsius", width=8),
        ts("Device power", "The card's power draw (absent for a device that does not "
           "report one, such as a CPU).",
           Q(fleet_max("llmgw_device_power_watts", DEVICE, DEV), "{{node}} {{device}}"),
           unit="watt", width=8),
        Panel("Device health", (
            Q(fleet_max("llmgw_device_healthy", DEVICE, DEV), "", instant=True),),
            "Each device's health in its node's last report (1: healthy).", kind="table"),
        Panel("Engines installed", (
            Q(fleet_max("llmgw_node_engine_installed", "node, engine", NODE), "",
              instant=True),),
            "The engines each node reports installed.", kind="table"),
        Row("Store and control service"),
        ts("Store members", "A replicated store's Patroni members: up (REST API answers "
           "and PostgreSQL runs) and leader (absent without LLMGW_PATRONI_URLS).",
           Q(fleet_max("llmgw_store_member_up", "member", ""), "{{member}} up"),
           Q(fleet_max("llmgw_store_member_leader", "member", ""), "{{member}} leader"),
           width=6),
        ts("Store standby lag", "Bytes of WAL each standby is behind the primary (absent "
           "when unknown).",
           Q(fleet_max("llmgw_store_member_lag_bytes", "member", ""), "{{member}}"),
           unit="bytes", width=6),
        ts("etcd voters healthy", "The store's etcd voters, 1 when healthy by etcd's own "
           "/health (absent without LLMGW_ETCD_URLS).",
           Q(fleet_max("llmgw_store_etcd_member_healthy", "member", ""), "{{member}}"),
           width=6),
        ts("Certificate expiry", "Seconds until each control instance's certificate and "
           "CA expire (absent without TLS; alert LlmgwCertificateExpiringSoon under 14 d).",
           Q("min by (instance, path) (llmgw_certificate_expiry_seconds)",
             "{{instance}} {{path}}"), unit="s", width=6),
    ))


MODELS = Dashboard(
    "llmgw-models", "llmgw / Models",
    "Requests, errors, latency, tokens, queue and replicas of each model (the routers' "
    "and the control service's /metrics).",
    (MODEL_VAR,),
    (
        Row("Requests"),
        ts("Requests per second", "Requests the routers answered, per model ((unknown): a "
           "name not in the routes table).",
           Q(f"sum by (model) (rate(llmgw_router_requests_total{{{M}}}[{RATE}]))",
             "{{model}}"), unit="reqps", width=8),
        ts("Answers by HTTP status", "The HTTP status of each answer (an engine's own when "
           "it answered).",
           Q(f"sum by (code) (rate(llmgw_router_requests_total{{{M}}}[{RATE}]))",
             "{{code}}"), unit="reqps", width=8, stack=True),
        ts("Errors by kind", "Requests the router refused or failed itself, by the OpenAI "
           "error code it answered (docs/api.md).",
           Q(f"sum by (model, code) (rate(llmgw_router_errors_total{{{M}}}[{RATE}]))",
             "{{model}} {{code}}"), unit="reqps", width=8),
        ts("Error ratio", "Errors as a share of the requests, per model.",
           Q(f"sum by (model) (rate(llmgw_router_errors_total{{{M}}}[{RATE}])) / "
             f"sum by (model) (rate(llmgw_router_requests_total{{{M}}}[{RATE}]))",
             "{{model}}"), unit="percentunit", width=8),
        ts("Clients that left", "Requests whose client went away while waiting or "
           "streaming: a client's choice, not an error.",
           Q(f"sum by (model, when) "
             f"(rate(llmgw_router_client_cancelled_total{{{M}}}[{RATE}]))",
             "{{model}} {{when}}"), unit="reqps", width=8),
        ts("Fallbacks", "Requests served by a fallback model, by why the model asked for "
           "could not serve.",
           Q(f"sum by (model, fallback, reason) "
             f"(rate(llmgw_router_fallbacks_total{{{M}}}[{RATE}]))",
             "{{model}} -> {{fallback}} ({{reason}})"), unit="reqps", width=8),
        Row("Latency"),
        ts("Time to first byte", "From the request to the first byte of the answer "
           "(streams: about the first token, an activation wait included).",
           *quantiles("llmgw_router_time_to_first_byte_seconds", "model", M, "{{model}}"),
           unit="s", width=8),
        ts("Total time", "From the request to the last byte of the answer (streams: to "
           "the end of the stream).",
           *quantiles("llmgw_router_request_duration_seconds", "model", M, "{{model}}"),
           unit="s", width=8),
        Panel("First byte distribution", (
            Q(f"sum by (le) (increase("
              f"llmgw_router_time_to_first_byte_seconds_bucket{{{M}}}[{RATE}]))",
              "{{le}}"),),
            "Requests by time to first byte (the histogram's buckets).", kind="heatmap",
            width=8),
        Row("Tokens"),
        ts("Tokens per second", "Prompt and completion tokens of the engines' usage "
           "objects, as the routers report them to the store (seconds late).",
           Q(f"sum by (model, kind) (max by (key, model, kind) "
             f"(rate(llmgw_key_tokens_total{{{M}}}[{RATE}])))", "{{model}} {{kind}}"),
           width=12),
        ts("Completion tokens per request", "Completion tokens over the requests the "
           "engine answered.",
           Q(f"sum by (model) (max by (key, model) "
             f"(rate(llmgw_key_tokens_total{{{M}, kind=\"completion\"}}[{RATE}]))) / "
             f"sum by (model) (max by (key, model) "
             f"(rate(llmgw_key_requests_total{{{M}}}[{RATE}])))", "{{model}}"), width=12),
        Row("Queue and capacity"),
        ts("Waiting for a slot", "Requests waiting in the routers for a free engine slot, "
           "and requests being answered.",
           Q(f"sum by (model) (llmgw_router_queue_depth{{{M}}})", "{{model}} waiting"),
           Q(f"sum by (model) (llmgw_router_in_flight{{{M}}})", "{{model}} in flight"),
           width=8),
        ts("Queue wait", "How long requests waited for a slot (those admitted at once "
           "are not counted).",
           *quantiles("llmgw_router_queue_wait_seconds", "model", M, "{{model}}"),
           unit="s", width=8),
        ts("Admissions", "Requests given a slot at once or after waiting.",
           Q(f"sum by (model, how) (rate(llmgw_router_admitted_total{{{M}}}[{RATE}]))",
             "{{model}} {{how}}"), unit="reqps", width=8),
        ts("Refusals for capacity", "Requests refused with 429 model_at_capacity (queue "
           "full, waited max_wait_s) or whose client left while waiting.",
           Q(f"sum by (model, reason) (rate(llmgw_router_rejected_total{{{M}}}[{RATE}]))",
             "{{model}} {{reason}}"), unit="reqps", width=8),
        ts("Slots", "Slots the routers' requests hold, and the slots of a scaled model's "
           "ready replicas.",
           Q(f"sum by (model) (llmgw_router_slots_in_use{{{M}}})", "{{model}} in use"),
           Q(fleet_max("llmgw_model_load_slots", "model", M), "{{model}} slots"), width=8),
        ts("At capacity", "1 while a router reported the model at capacity within the "
           "last 30 s.",
           Q(fleet_max("llmgw_model_at_capacity", "model", M), "{{model}}"), width=8),
        Row("Replicas and autoscaler"),
        ts("Replicas", "Ready replicas, what the model wants now, the autoscaler's target "
           "and the catalog's range.",
           Q(fleet_max("llmgw_model_ready_replicas", "model", M), "{{model}} ready"),
           Q(fleet_max("llmgw_model_desired_replicas", "model", M), "{{model}} wanted"),
           Q(fleet_max("llmgw_model_autoscale_target_replicas", "model", M),
             "{{model}} target"),
           Q(fleet_max("llmgw_model_replicas_min", "model", M), "{{model}} min"),
           Q(fleet_max("llmgw_model_replicas_max", "model", M), "{{model}} max"), width=8),
        ts("Autoscaler steps", "Changes of the autoscaler's target in each interval (a "
           "step up or down; docs/autoscaling.md).",
           Q(f"max by (model) "
             f"(changes(llmgw_model_autoscale_target_replicas{{{M}}}[{RATE}]))",
             "{{model}}"), width=8),
        ts("Autoscaler blocked", "1, with placement's reason, while requests wait too "
           "long and the last step up found no room.",
           Q(fleet_max("llmgw_model_autoscale_blocked", "model, reason", M),
             "{{model}} {{reason}}"), width=8),
        ts("Autoscaler signal", "What the autoscaler reads from the routers (last 3 s): "
           "requests waiting, slots busy, refusals.",
           Q(fleet_max("llmgw_model_load_waiting_requests", "model", M),
             "{{model}} waiting"),
           Q(fleet_max("llmgw_model_load_busy_slots", "model", M), "{{model}} busy"),
           Q(fleet_max("llmgw_model_load_rejected_requests", "model", M),
             "{{model}} refused")),
        ts("Autoscaler wait signal", "The longest queue wait a router saw (p90 of "
           "finished waits, or the oldest still waiting; last 3 s).",
           Q(fleet_max("llmgw_model_load_wait_seconds", "model", M), "{{model}}"),
           unit="s"),
        Row("Health and rollouts"),
        ts("Failed starts and parking", "Failed starts in a row, 1 while parked (after 5), "
           "1 while placement cannot place the model (with the reason).",
           Q(fleet_max("llmgw_model_consecutive_failures", "model", M),
             "{{model}} failures"),
           Q(fleet_max("llmgw_model_parked", "model", M), "{{model}} parked"),
           Q(fleet_max("llmgw_model_unplaceable", "model, reason", M),
             "{{model}} unplaceable {{reason}}"), width=8),
        ts("Rollouts", "1 while the model's rollout is rolling, in canary or failed "
           "(alert LlmgwRolloutFailed).",
           Q(fleet_max("llmgw_model_rollout_state", "model, state",
                       f'{M}, state!="none"'), "{{model}} {{state}}"),
           Q(fleet_max("llmgw_model_rollout_failed", "model", M), "{{model}} failed"),
           width=8),
        ts("Drains", "Replicas finishing their requests before they stop, and requests "
           "cut when a drain ran out of time (alert LlmgwDrainCutRequests).",
           Q(fleet_max("llmgw_replicas_draining", "model", M), "{{model}} draining"),
           Q(f"max by (model) (increase(llmgw_drain_cut_requests_total{{{M}}}[{RATE}]))",
             "{{model}} cut"), width=8),
        ts("Canary: requests by version", "Requests of a model under a canary rollout, "
           "by version and outcome.",
           Q(f"sum by (model, version, outcome) "
             f"(rate(llmgw_router_version_requests_total{{{M}}}[{RATE}]))",
             "{{model}} {{version}} {{outcome}}"), unit="reqps"),
        ts("Canary: first byte by version", "Time to first byte of each version of a "
           "model under a canary rollout (p90).",
           Q(f"histogram_quantile(0.9, sum by (le, model, version) "
             f"(rate(llmgw_router_version_first_byte_seconds_bucket{{{M}}}[{RATE}])))",
             "{{model}} {{version}} p90"), unit="s"),
    ))


KEYS = Dashboard(
    "llmgw-keys", "llmgw / API keys",
    "Requests, tokens and refusals per API key (the control service's usage counters: '-' "
    "is requests without a key), and the routers' refusals tied to keys by code.",
    (Var("key", "API key", "label_values(llmgw_key_requests_total, key)"),
     Var("model", "Model", "label_values(llmgw_key_requests_total, model)")),
    (
        Row("Use"),
        ts("Requests per key", "Requests of each key that the engine answered.",
           Q(f"sum by (key) (max by (key, model) "
             f"(rate(llmgw_key_requests_total{{{KEY}}}[{RATE}])))", "{{key}}"),
           unit="reqps"),
        ts("Tokens per second per key", "Prompt and completion tokens of each key's "
           "requests.",
           Q(f"sum by (key, kind) (max by (key, model, kind) "
             f"(rate(llmgw_key_tokens_total{{{KEY}}}[{RATE}])))", "{{key}} {{kind}}")),
        Panel("Top keys by tokens", (
            Q(f"topk(10, sum by (key) (max by (key, model, kind) "
              f"(increase(llmgw_key_tokens_total{{{KEY}}}[{RANGE}]))))", "{{key}}",
              instant=True),),
            "The keys that used the most tokens in the dashboard's time range.",
            kind="bargauge", width=8),
        Panel("Usage by key and model", (
            Q(f"sum by (key, model) (max by (key, model) "
              f"(increase(llmgw_key_requests_total{{{KEY}}}[{RANGE}])))", "", instant=True),
            Q(f"sum by (key, model, kind) (max by (key, model, kind) "
              f"(increase(llmgw_key_tokens_total{{{KEY}}}[{RANGE}])))", "", instant=True),
            Q(f"sum by (key, model) (max by (key, model) "
              f"(increase(llmgw_usage_refused_total{{{KEY}}}[{RANGE}])))", "", instant=True)),
            "Requests, tokens and refused requests of each key and model in the time "
            "range.", kind="table",
            width=16),
        ts("Requests by key and model", "Requests of each key to each model.",
           Q(f"max by (key, model) (rate(llmgw_key_requests_total{{{KEY}}}[{RATE}]))",
             "{{key}} {{model}}"), unit="reqps"),
        Row("Refusals"),
        ts("Refusals per key", "Requests of each key that the routers refused with their "
           "own error: over its --rpm or --tpm, a model outside its scope, an expired key, "
           "the model's queue full or wait too long, ... (the usage the routers report; "
           "`llmgw ctl usage` shows the same as REFUSED). Requests without a key or with a "
           "wrong key have no key to count under: see the refusals by code.",
           Q(f"sum by (key) (max by (key, model) "
             f"(rate(llmgw_usage_refused_total{{{KEY}}}[{RATE}])))", "{{key}}"),
           unit="reqps"),
        ts("Refusals by key and model", "Each key's refused requests per model (model "
           "(unknown): refused before it named a model the key may use).",
           Q(f"max by (key, model) (rate(llmgw_usage_refused_total{{{KEY}}}[{RATE}]))",
             "{{key}} {{model}}"), unit="reqps"),
        ts("Key refusals by code", "Requests the routers refused for their key, by code: "
           "a wrong or expired key (invalid_api_key), an address sending wrong keys "
           "(too_many_failed_keys), a key over its --rpm or --tpm (rate_limit_exceeded); "
           "counted by every router, wrong keys and no key included.",
           Q(f"sum by (code) "
             f"(rate(llmgw_router_errors_total{{code=~\"{KEY_REFUSALS}\"}}[{RATE}]))",
             "{{code}}"),
           unit="reqps"),
        ts("Keys' requests refused for capacity", "All requests refused for capacity "
           "per model (a key's priority decides who waits first; docs/keys.md).",
           Q(f"sum by (model, reason) (rate(llmgw_router_rejected_total{{model=~\"$model\"}}"
             f"[{RATE}]))", "{{model}} {{reason}}"), unit="reqps"),
    ))

DASHBOARDS = (FLEET, MODELS, KEYS)


# ---------------------------------------------------------------------- the files


METRIC_RE = re.compile(r"\bllmgw_[a-z0-9_]+\b")
LABEL_VALUES_RE = re.compile(r"^label_values\((\w+)(\{[^}]*\})?, *(\w+)\)$")


def queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """Every PromQL of a dashboard's JSON as (where, query): each panel's targets
    (``panel title / refId``) and each query variable's ``label_values(...)``."""
    found = [(f"{panel['title']} / {target['refId']}", target["expr"])
             for panel in doc["panels"] for target in panel.get("targets", [])]
    found += [(f"variable {var['name']}", var["definition"])
              for var in doc["templating"]["list"] if var["type"] == "query"]
    return found


def metric_names(query: str) -> set[str]:
    """The llmgw metric names a query reads (as Prometheus stores them: a counter's with
    ``_total``, a histogram's ``_bucket``)."""
    return set(METRIC_RE.findall(query))


def files() -> dict[str, str]:
    """File name -> the JSON text this script writes for it."""
    return {f"{d.uid}.json": json.dumps(render(d), indent=2, sort_keys=False) + "\n"
            for d in DASHBOARDS}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    OUT.mkdir(exist_ok=True)
    for name, text in files().items():
        path = OUT / name
        if path.exists() and path.read_text() == text:
            continue
        if check:
            stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(HERE.parent)}")
    if stale:
        print(f"monitoring/dashboards/{', '.join(stale)} differ from what "
              "monitoring/make_dashboards.py writes: run it and commit the result",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
