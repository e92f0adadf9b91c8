"""The autoscaling gauges of the control service's ``/metrics``: each model's replica
range and, for a model with one, the target and the signal it is scaled on. Read at scrape
time from the same view as ``ctl status`` and the console (``autoscale.view``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from ..catalog.scale import replica_range
from . import autoscale

_SIGNAL = (
    ("llmgw_model_load_waiting_requests", "Requests waiting for a slot in the routers "
     "(summed over routers, last 3 s)", "waiting"),
    ("llmgw_model_load_busy_slots", "Slots busy with the routers' requests (each router's "
     "peak, summed, last 3 s)", "busy"),
    ("llmgw_model_load_slots", "Slots of the model's ready replicas", "slots"),
    ("llmgw_model_load_wait_seconds", "The longest queue wait a router saw (p90 of finished "
     "waits, or the oldest still waiting; last 3 s)", "wait_s"),
    ("llmgw_model_load_rejected_requests", "Requests refused for capacity (summed over "
     "routers, last 3 s)", "rejected"),
)


def families(models: list[Any], by_model: dict[str, list[Any]], now: float
             ) -> Iterator[Metric]:
    """``llmgw_model_replicas_min``/``_max`` of every model; for a model with a range, its
    target, the signal and whether its last step up found no room."""
    low = GaugeMetricFamily("llmgw_model_replicas_min", "The catalog's min replicas (an "
                            "on-demand model: 0)", labels=["model"])
    high = GaugeMetricFamily("llmgw_model_replicas_max", "The catalog's max replicas (a "
                             "fixed number: the same as the min)", labels=["model"])
    target = GaugeMetricFamily("llmgw_model_autoscale_target_replicas", "Replicas the "
                               "autoscaler wants now (models with a replica range)",
                               labels=["model"])
    blocked = GaugeMetricFamily("llmgw_model_autoscale_blocked", "1 (with the reason) while "
                                "requests wait too long and the last step up found no room "
                                "in the fleet", labels=["model", "reason"])
    signal = [(GaugeMetricFamily(name, text, labels=["model"]), key)
              for name, text, key in _SIGNAL]
    for model in models:
        minimum, maximum = replica_range(model.replicas, getattr(model, "replicas_max", None),
                                         bool(model.on_demand))
        low.add_metric([model.name], minimum)
        high.add_metric([model.name], maximum)
        view = autoscale.view(model, by_model.get(model.name, []), now)
        if view is None:
            continue
        target.add_metric([model.name], view["target"])
        stuck = view["blocked"] if view["up_for_s"] is not None else None
        blocked.add_metric([model.name, stuck or ""], 1 if stuck else 0)
        for family, key in signal:
            value = view["signal"][key]
            if value is not None:
                family.add_metric([model.name], value)
    yield from (low, high, target, blocked, *(f for f, _ in signal))
