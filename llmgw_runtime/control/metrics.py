"""Prometheus metrics of the control service, served at ``GET /metrics``.

A collector reads the store when Prometheus scrapes (one transaction, five queries) and
keeps nothing between scrapes: no per-request writes, no thread. Model states come from
the same pure core as ``ctl status`` (``states.model_state``), so they cannot disagree.
Every gunicorn worker answers for the whole instance: the store is shared, and the leader
gauge compares the lease holder's instance with this one's (``ControlConfig.instance``).
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, Flask, Response, current_app, request
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from ..api.states import ReplicaState
from ..errors import AuthError
from ..fleetvocab import heard_from
from ..security import bearer
from ..status.summary import AT_CAPACITY_S, device_label
from ..store import Store, repo
from ..store.members import StoreHealth
from . import autoscale_metrics, fleet, rollout_metrics
from .config import ControlConfig, instance_of_holder
from .reconcile import LEASE
from .states import model_state, wanted_replicas
from .usage_metrics import UsageCollector

log = logging.getLogger(__name__)

REPLICA_STATES = tuple(ReplicaState)
MIB = 1024 * 1024
# (metric, help, device field, factor): skipped when the device reports null
_DEVICE_GAUGES = (
    ("llmgw_device_memory_total_bytes", "Memory of the device", "memory_total_mb", MIB),
    ("llmgw_device_memory_used_bytes", "Memory in use on the device", "memory_used_mb", MIB),
    ("llmgw_device_temperature_celsius", "Temperature of the device's card",
     "temperature_c", 1),
    ("llmgw_device_power_watts", "Power draw of the device's card", "power_w", 1),
)


class _Unparked:
    """A models row seen as if not parked: what the catalog or activation asks for."""

    parked = False

    def __init__(self, row: Any) -> None:
        self._row = row

    def __getattr__(self, name: str) -> Any:
        return getattr(self._row, name)


def desired_replicas(model: Any, live: list[Any], now: float) -> int:
    """The ``wanted`` of ``ctl status``; for a parked model what it would want unparked,
    so "desired > 0 and ready == 0" holds while it is parked."""
    return wanted_replicas(_Unparked(model) if model.parked else model, live, now)


def certificate_not_after(path: str) -> float:
    """When the (first-expiring) certificate in the PEM file ``path`` expires (Unix s)."""
    try:
        from cryptography import x509
    except ImportError:  # cryptography is optional at run time
        import ssl

        info = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]
        return float(ssl.cert_time_to_seconds(info["notAfter"]))
    with open(path, "rb") as fh:
        certs = x509.load_pem_x509_certificates(fh.read())
    return min(c.not_valid_after_utc.timestamp() for c in certs)


class ControlCollector(Collector):
    """Fleet, model, node, device, leadership and certificate gauges, read per scrape."""

    def __init__(self, store: Store, config: ControlConfig,
                 clock: Callable[[], float] = time.time,
                 store_health: StoreHealth | None = None) -> None:
        self._store = store
        self._config = config
        self._clock = clock
        self._instance = config.instance
        self._cert_problems: dict[str, str] = {}
        self._store_health = store_health

    def collect(self) -> Iterator[Metric]:
        with self._store.begin() as conn:
            holder = repo.lease_holder(conn, LEASE, self._store.now(conn))
            models = repo.list_models(conn)
            replicas = repo.list_replicas(conn)
            nodes = repo.list_nodes(conn)
            cut = fleet.drain_cut_totals(conn)
        now = self._clock()
        yield from self._models(models, replicas, now)
        yield from rollout_metrics.model_families(models, replicas, cut)
        yield from self._replicas(replicas)
        yield from self._nodes(nodes, now)
        yield from rollout_metrics.node_families(nodes)
        leader = GaugeMetricFamily("llmgw_leader", "1 when this control instance (one of "
                                   "its workers) holds the reconciler lease", labels=["instance"])
        leader.add_metric([self._instance], float(
            holder is not None and instance_of_holder(holder) == self._instance))
        yield leader
        yield from self._certificates(now)
        yield from self._store_members()
        yield from self._etcd_voters()

    def _models(self, models: list[Any], replicas: list[Any], now: float) -> Iterator[Metric]:
        by_model: dict[str, list[Any]] = defaultdict(list)
        for rep in replicas:
            by_model[rep.model].append(rep)
        desired = GaugeMetricFamily("llmgw_model_desired_replicas",
                                    "Replicas the model should have now (for a parked model: "
                                    "what it asks for unparked)", labels=["model"])
        ready = GaugeMetricFamily("llmgw_model_ready_replicas", "Ready replicas of the model",
                                  labels=["model"])
        failures = GaugeMetricFamily("llmgw_model_consecutive_failures",
                                     "Failed starts of the model in a row", labels=["model"])
        parked = GaugeMetricFamily("llmgw_model_parked", "1 when the model is parked after "
                                   "repeated failed starts", labels=["model"])
        unplaceable = GaugeMetricFamily("llmgw_model_unplaceable",
                                        "1 (with the reason) when placement cannot place the "
                                        "model's replicas", labels=["model", "reason"])
        full = GaugeMetricFamily("llmgw_model_at_capacity", "1 when a router reported the "
                                 "model at capacity (every slot taken, requests waiting or "
                                 f"refused) within the last {AT_CAPACITY_S:g} s",
                                 labels=["model"])
        for model in models:
            reps = by_model.get(model.name, [])
            state = model_state(model, reps, now)
            live = [r for r in reps if r.desired]
            desired.add_metric([model.name], desired_replicas(model, live, now))
            ready.add_metric([model.name], state.ready)
            failures.add_metric([model.name], model.consecutive_failures)
            parked.add_metric([model.name], 1 if model.parked else 0)
            if model.placement_reason and not model.parked:
                unplaceable.add_metric([model.name, model.placement_reason], 1)
            else:
                unplaceable.add_metric([model.name, ""], 0)
            at = getattr(model, "capacity_at", None)
            full.add_metric([model.name], 1 if at is not None and now - at <= AT_CAPACITY_S
                            else 0)
        yield from (desired, ready, failures, parked, unplaceable, full)
        yield from autoscale_metrics.families(models, by_model, now)

    def _replicas(self, replicas: list[Any]) -> Iterator[Metric]:
        counts = Counter(r.state for r in replicas)
        family = GaugeMetricFamily("llmgw_replicas", "Replicas by state", labels=["state"])
        for state in (*REPLICA_STATES, *sorted(set(counts) - set(REPLICA_STATES))):
            family.add_metric([state], counts.get(state, 0))
        yield family

    def _nodes(self, nodes: list[Any], now: float) -> Iterator[Metric]:
        reporting = GaugeMetricFamily("llmgw_node_reporting", "1 when the node reported "
                                      "within LLMGW_NODE_TIMEOUT_S", labels=["node"])
        age = GaugeMetricFamily("llmgw_node_last_report_age_seconds",
                                "Seconds since the node's last report", labels=["node"])
        engines = GaugeMetricFamily("llmgw_node_engine_installed",
                                    "1 per engine the node reports installed",
                                    labels=["node", "engine"])
        labels = ["node", "device", "class"]
        healthy = GaugeMetricFamily("llmgw_device_healthy", "1 when the device is healthy "
                                    "(as last reported)", labels=labels)
        gauges = [(GaugeMetricFamily(name, text, labels=labels), field, factor)
                  for name, text, field, factor in _DEVICE_GAUGES]
        timeout = self._config.node_timeout_s
        for node in nodes:
            name = node.name
            last = node.last_report
            node_labels = {"node": name}        # one dict per label set: rendered once
            _add(reporting, node_labels, float(heard_from(last, now, timeout)))
            if last is not None:
                _add(age, node_labels, max(0.0, now - last))
            for engine in _json_list(node.engines, str):
                engines.add_metric([name, engine], 1)
            for dev in _json_list(node.devices, dict):
                dev_labels = {"node": name, "device": device_label(dev),
                              "class": str(dev.get("class"))}
                _add(healthy, dev_labels, 1 if dev.get("healthy", True) else 0)
                for family, field, factor in gauges:
                    value = dev.get(field)
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        _add(family, dev_labels, value * factor)
        yield from (reporting, age, engines, healthy, *(g for g, _, _ in gauges))

    def _store_members(self) -> Iterator[Metric]:
        """Each Patroni member of a replicated store: answering, leader, lag."""
        members = self._store_health.members() if self._store_health else None
        if members is None:
            return
        up = GaugeMetricFamily("llmgw_store_member_up", "1 when the store member's Patroni "
                               "answers and its PostgreSQL runs (0: missing)",
                               labels=["member"])
        leader = GaugeMetricFamily("llmgw_store_member_leader", "1 for the store member "
                                   "Patroni reports as leader (the primary)", labels=["member"])
        lag = GaugeMetricFamily("llmgw_store_member_lag_bytes", "Bytes of WAL the standby "
                                "is behind the primary (absent when unknown)",
                                labels=["member"])
        for m in members:
            up.add_metric([m["name"]], 0 if m["missing"] else 1)
            leader.add_metric([m["name"]], 1 if m["role"] == "leader" and not m["missing"]
                              else 0)
            if m["lag_bytes"] is not None and not m["missing"]:
                lag.add_metric([m["name"]], m["lag_bytes"])
        yield from (up, leader, lag)

    def _etcd_voters(self) -> Iterator[Metric]:
        """Each etcd voter of a replicated store: healthy by etcd's own /health (a voter
        that never started, or stopped answering, is 0)."""
        voters = self._store_health.voters() if self._store_health else None
        if voters is None:
            return
        healthy = GaugeMetricFamily("llmgw_store_etcd_member_healthy", "1 when the store's "
                                    "etcd voter answers healthy on its client URL (0: "
                                    "unhealthy, not answering or never started)",
                                    labels=["member"])
        for v in voters:
            healthy.add_metric([v["name"]], 1 if v["healthy"] else 0)
        yield healthy

    def _certificates(self, now: float) -> Iterator[Metric]:
        paths = [p for p in (self._config.tls_cert, self._config.ca_file) if p]
        if not paths:
            return
        family = GaugeMetricFamily("llmgw_certificate_expiry_seconds",
                                   "Seconds until the certificate expires (negative: expired)",
                                   labels=["path"])
        for path in dict.fromkeys(paths):
            try:
                family.add_metric([path], certificate_not_after(path) - now)
                self._cert_problems.pop(path, None)
            except (OSError, ValueError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
                if self._cert_problems.get(path) != problem:  # once per new problem
                    log.warning("certificate %s cannot be read for its expiry metric: %s",
                                path, problem)
                    self._cert_problems[path] = problem
        yield family


def _add(family: Metric, labels: dict[str, str], value: float) -> None:
    """``add_metric`` that shares ``labels`` between samples (a device's labels across its
    gauges), so :func:`render` escapes them once."""
    family.samples.append(Sample(family.name, labels, value, None))


def _json_list(text: str | None, kind: type) -> list[Any]:
    """The items of type ``kind`` of a JSON list column; nothing for NULL or a bad value."""
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return []
    return [v for v in value if isinstance(v, kind)] if isinstance(value, list) else []


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(registry: CollectorRegistry) -> bytes:
    """The text format (0.0.4) of ``registry``'s gauges and counters. ``generate_latest``
    formats every sample's labels anew (about half a second for 2,000 nodes x 8 devices); here a label
    set shared by several samples is formatted once."""
    out: list[str] = []
    label_text: dict[int, tuple[dict[str, str], str]] = {}   # keeps each dict alive
    for family in registry.collect():
        if family.type not in ("gauge", "counter"):
            raise TypeError(f"render() writes gauges and counters only, not {family.type} "
                            f"{family.name}")
        help_text = family.documentation.replace("\\", "\\\\").replace("\n", "\\n")
        name = family.name + ("_total" if family.type == "counter" else "")
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {family.type}\n")
        for sample in family.samples:
            cached = label_text.get(id(sample.labels))
            if cached is None:
                text = ("{" + ",".join(f'{k}="{_escape(v)}"' for k, v in sample.labels.items())
                        + "}") if sample.labels else ""
                label_text[id(sample.labels)] = (sample.labels, text)
            else:
                text = cached[1]
            out.append(f"{sample.name}{text} {floatToGoString(sample.value)}\n")
    return "".join(out).encode()


def install(app: Flask, store: Store, config: ControlConfig) -> CollectorRegistry:
    """Give ``app`` its own registry (so tests can make several apps) and ``/metrics``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControlCollector(store, config,
                                       store_health=app.extensions.get("llmgw.store_health")))
    registry.register(UsageCollector(store))
    app.extensions["llmgw.metrics"] = registry
    app.register_blueprint(bp)
    return registry


bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def metrics() -> Response:
    config: ControlConfig = current_app.config["LLMGW"]
    if config.metrics_token:
        token = bearer(request.headers.get("Authorization")) or ""
        if not hmac.compare_digest(token.encode(), config.metrics_token.encode()):
            raise AuthError("/metrics needs 'Authorization: Bearer <LLMGW_METRICS_TOKEN>' "
                            "on this control service; set it in Prometheus' scrape config "
                            "(authorization: credentials)")
    registry: CollectorRegistry = current_app.extensions["llmgw.metrics"]
    return Response(render(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)
