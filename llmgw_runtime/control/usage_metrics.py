"""``/metrics`` counters of usage per API key and model (``llmgw_key_requests_total``,
``llmgw_key_tokens_total{kind="prompt"|"completion"}``, ``llmgw_usage_refused_total``: the
key's requests the routers refused), read from the store's totals at
each scrape (one query): they count since the store began, so a router's restart does not
reset them. Keys are named as the admin named them (``-``: requests without a key;
``(deleted)``: a key deleted before its router reported); models by their catalog names
(``(unknown)``: any name the catalog did not have, so reports cannot add series)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from ..store import Store, usage


class UsageCollector(Collector):
    def __init__(self, store: Store) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        with self._store.begin() as conn:
            rows = usage.totals(conn)
        requests = CounterMetricFamily(
            "llmgw_key_requests", "Requests of the API key to the model that the engine "
            "answered, as the routers reported them", labels=["key", "model"])
        tokens = CounterMetricFamily(
            "llmgw_key_tokens", "Tokens of the API key's requests to the model, from the "
            "engines' usage objects (kind: prompt or completion)",
            labels=["key", "model", "kind"])
        refused = CounterMetricFamily(
            "llmgw_usage_refused", "Requests of the API key to the model that a router "
            "refused with its own error (over the key's limits, outside its scope, expired, "
            "queue full or wait too long, ...), as the routers reported them; requests "
            "without a key or with an invalid key are not counted here",
            labels=["key", "model"])
        for row in rows:
            requests.add_metric([row.key, row.model], row.requests)
            tokens.add_metric([row.key, row.model, "prompt"], row.prompt_tokens)
            tokens.add_metric([row.key, row.model, "completion"], row.completion_tokens)
            refused.add_metric([row.key, row.model], row.refused)
        yield requests
        yield tokens
        yield refused
