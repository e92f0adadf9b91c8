"""The rollout and drain gauges of the control service's ``/metrics``: each model's rollout
state (and whether it failed: the alert LlmgwRolloutFailed), its replicas draining and the
requests drains cut when their time ran out; each node cordoned or draining. Read at scrape
time from the same rows and the same rules as ``ctl status`` (status.changes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..status import changes
from . import drain

STATES = ("none", "rolling", "canary", "failed")


def model_families(models: list[Any], replicas: list[Any], cut: dict[str, int]
                   ) -> Iterator[Metric]:
    """Per model: its rollout state (one sample per state, 1 for the one it is in), 1 when
    its rollout failed, its replicas draining, and the requests cut by drain timeouts."""
    state = GaugeMetricFamily("llmgw_model_rollout_state", "1 for the state of the model's "
                              "rollout (none, rolling, canary, failed), 0 for the others",
                              labels=["model", "state"])
    failed = GaugeMetricFamily("llmgw_model_rollout_failed", "1 when the model's new "
                               "definition failed to start: the rollout stopped and the old "
                               "replicas keep serving", labels=["model"])
    draining = GaugeMetricFamily("llmgw_replicas_draining", "Replicas of the model finishing "
                                 "their requests in flight before they stop", labels=["model"])
    cuts = CounterMetricFamily("llmgw_drain_cut_requests", "Requests still in flight when a "
                               "draining replica of the model reached its drain_timeout_s "
                               "and was stopped anyway", labels=["model"])
    drains = Counter(r.model for r in replicas if drain.is_draining(r))
    for model in models:
        stored = changes.rollout_state({"rollout_state": model.rollout_state})
        now_in = "none" if stored is None else str(stored["state"])
        for name in STATES:
            state.add_metric([model.name, name], 1 if name == now_in else 0)
        failed.add_metric([model.name], 1 if now_in == "failed" else 0)
        draining.add_metric([model.name], drains.get(model.name, 0))
    # every model from 0, so that a first cut is an increase Prometheus sees
    for name in sorted({m.name for m in models} | set(cut)):
        cuts.add_metric([name], cut.get(name, 0))
    yield from (state, failed, draining, cuts)


def node_families(nodes: list[Any]) -> Iterator[Metric]:
    """Per node row: 1 when cordoned (no new replica is placed there: cordoned, or
    draining), 1 while draining (its replicas move elsewhere; a drain done leaves it
    cordoned), by control/drain.py's rules."""
    cordoned = GaugeMetricFamily("llmgw_node_cordoned", "1 when no new replica is placed "
                                 "on the node (ctl nodes cordon, or a drain)", labels=["node"])
    draining = GaugeMetricFamily("llmgw_node_draining", "1 while the node's replicas move "
                                 "elsewhere (ctl nodes drain)", labels=["node"])
    for node in nodes:
        cordoned.add_metric([node.name], 1 if drain.cordoned(node) else 0)
        draining.add_metric([node.name], 1 if drain.draining_node(node) else 0)
    yield from (cordoned, draining)
