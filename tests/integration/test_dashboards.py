"""Every query of llmgw's Grafana dashboards (monitoring/dashboards/) against a real
Prometheus (Debian's /usr/bin/prometheus) scraping a real control service and router over
HTTPS every second, with an agent running the tiny model on llama.cpp and a second node
reporting a GPU (from a devices file: temperature, power). Requests of every kind give the
counters and histograms their series: answered, streamed, with and without an API key, a
key over its limit, an unknown model, a stopped model served by its fallback, a request
that waits for the one slot, one refused for capacity and a client that leaves
mid-stream. Then each panel's query (its Grafana variables replaced: ``$model`` by ``.*``,
``$__rate_interval`` by 1m) must run without error and return series; the few metrics that
need what did not happen here are listed in ALLOWED_EMPTY with the reason, and still must
exist as families in the services' /metrics."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from llmgw_runtime.router.metrics import RouterMetrics
from tests.monitoring.support import all_queries, generator
from tests.support.certs import make_pki
from tests.support.procs import free_port, wait_until

from .conftest import Cluster, metric_in

pytestmark = pytest.mark.slow

PROMETHEUS = Path("/usr/bin/prometheus")
WINDOW = "1m"
GRAFANA = {"$__rate_interval": WINDOW, "$__range": WINDOW, "$__interval": WINDOW}
TEMPLATE = re.compile(r"\$\{?(model|key|class|node)\}?")
# metric -> why a query of it may find no series here
ALLOWED_EMPTY = {
    "llmgw_store_member_lag_bytes": "the store's one Patroni URL here is a closed port: a "
                                    "member that does not answer has no lag",
    "llmgw_router_version_requests_total": "counted only while a canary rollout holds "
                                           "(tests/integration/test_rollouts.py runs one)",
    "llmgw_router_version_first_byte_seconds_bucket": "the same: a canary rollout's",
}

CATALOG = """\
models:
  - name: tiny
    source: file://{path}
    engine: llama.cpp
    profile: {{class: cpu}}
    args: ["--ctx-size", "2048", "--threads", "1"]
    replicas: {{min: 1, max: 2}}
    slots: 1
    max_queue: 1
  - name: spare
    source: file://{path}
    engine: llama.cpp
    profile: {{class: cpu}}
    replicas: 0
    fallback: [tiny]
"""


GPU = """\
devices:
  - {uuid: GPU-dashboards, class: h100-80g, memory_total_mb: 81559, memory_used_mb: 512,
     temperature_c: 41, power_w: 72.5}
"""


class Prometheus:
    """Debian's Prometheus on 127.0.0.1 with a fresh data directory, scraping ``targets``
    (job -> host:port) over HTTPS with the cluster's CA every second."""

    def __init__(self, root: Path, targets: dict[str, str], ca_file: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.url = f"http://127.0.0.1:{free_port()}"
        config = root / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": job, "scheme": "https",
                                "tls_config": {"ca_file": ca_file},
                                "static_configs": [{"targets": [target]}]}
                               for job, target in targets.items()]}))
        self.log = root / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [str(PROMETHEUS), f"--config.file={config}",
                 f"--storage.tsdb.path={root / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}",
                 "--log.level=warn"], stdout=out, stderr=subprocess.STDOUT)

    def query(self, promql: str) -> dict[str, Any]:
        """/api/v1/query's answer (``status`` error with ``error`` for a bad query)."""
        answer = requests.get(self.url + "/api/v1/query", params={"query": promql},
                              timeout=10)
        return dict(answer.json())

    def series(self, promql: str) -> list[dict[str, Any]]:
        answer = self.query(promql)
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def prometheus_factory() -> Iterator[Any]:
    if not PROMETHEUS.is_file():
        pytest.fail(f"{PROMETHEUS} is missing: install Debian's prometheus package "
                    "(make system-deps does, as root)")
    made: list[Prometheus] = []

    def make(*args: Any) -> Prometheus:
        made.append(Prometheus(*args))
        return made[-1]

    yield make
    for prom in made:
        prom.stop()


class Traffic:
    """Requests to the cluster's router with its CA."""

    def __init__(self, c: Cluster) -> None:
        self.c = c
        self.session = requests.Session()

    def chat(self, model: str, key: str | None = None, stream: bool = False,
             max_tokens: int = 4, **extra: Any) -> requests.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "hello world"}],
                "max_tokens": max_tokens, "stream": stream, **extra}
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return self.session.post(self.c.router_url + "/v1/chat/completions", json=body,
                                 headers=headers, timeout=60, stream=stream,
                                 verify=self.c.ca_file)

    def router_metric(self, name: str, **labels: str) -> float:
        return metric_tls(self.c.router_url, self.c.ca_file, name, **labels) or 0.0


def metric_tls(url: str, ca_file: str | None, name: str, **labels: str) -> float | None:
    return metric_in(requests.get(url + "/metrics", verify=ca_file, timeout=10).text, name,
                     **labels)


def make_traffic(t: Traffic, key: str) -> None:
    for stream in (False, True):                       # answered, without a key
        answer = t.chat("tiny", stream=stream)
        assert answer.status_code == 200, answer.text
        answer.close()
    answers = [t.chat("tiny", key=key).status_code for _ in range(3)]
    assert answers == [200, 200, 429], answers         # the key's --rpm 2
    assert t.chat("no-such-model").status_code == 404
    fallback = t.chat("spare")                          # replicas: 0 -> served by tiny
    assert fallback.status_code == 200, fallback.text

    # One slot and a queue of one: a long stream holds the slot, a second request waits,
    # a third is refused for capacity; then the first client leaves mid-stream.
    holder = t.chat("tiny", stream=True, max_tokens=1900, ignore_eos=True)
    assert holder.status_code == 200, holder.text
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(t.chat, "tiny")
        wait_until(lambda: t.router_metric("llmgw_router_queue_depth", model="tiny") == 1,
                   10, "a request waiting for tiny's slot", interval=0.02)
        refused = t.chat("tiny")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "model_at_capacity"
        holder.close()                                   # the client leaves
        assert waiting.result().status_code == 200


def test_every_dashboard_query_returns_series_from_a_real_prometheus(
        cluster_factory: Any, tiny_model: Path, tmp_path: Path,
        prometheus_factory: Any) -> None:
    make_pki(tmp_path / "pki")
    c: Cluster = cluster_factory(pki=tmp_path / "pki")
    # first: Prometheus takes its first targets some seconds after it starts
    prom = prometheus_factory(tmp_path / "prometheus", {
        "llmgw-control": f"127.0.0.1:{c.control_port}",
        "llmgw-router": f"127.0.0.1:{c.router_port}"}, c.ca_file)
    closed = f"http://127.0.0.1:{free_port()}"          # a store member that does not answer
    c.start_control(env={"LLMGW_PATRONI_URLS": closed, "LLMGW_ETCD_URLS": closed})
    key = c.admin.post("/api/v1/keys", {"name": "dash", "rpm": 2})["key"]
    c.apply(CATALOG.format(path=tiny_model))
    c.start_router()
    c.start_agent()
    # a second node with a GPU as a devices file describes it: temperature and power
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(GPU)
    c.start_agent("agent-gpu", devices=f"fake:{gpu}", node="gpu1")
    c.wait_ready("tiny")
    t = Traffic(c)
    make_traffic(t, key)

    # the routers' usage reports reach the store; Prometheus scrapes twice after that
    wait_until(lambda: metric_tls(c.control_url, c.ca_file, "llmgw_key_requests_total",
                                  key="dash", model="tiny") == 2, 15, "dash's usage reported")
    # the request over dash's --rpm: refused by the router, booked under the key's name
    wait_until(lambda: metric_tls(c.control_url, c.ca_file, "llmgw_usage_refused_total",
                                  key="dash", model="tiny") == 1, 15,
               "dash's refusal reported")
    assert [r["refused"] for r in c.admin.get("/api/v1/usage?by=key")["rows"]
            if r["key"] == "dash"] == [1]
    wait_until(lambda: metric_tls(c.router_url, c.ca_file,
                                  "llmgw_router_client_cancelled_total",
                                  model="tiny", when="streaming"), 10,
               "the router counting the client that left mid-stream")
    wait_until(lambda: c.admin.get("/api/v1/status")["nodes"]["reporting"] == 2, 15,
               "both agents' reports")
    settled = time.time()

    def scraped_twice() -> bool:
        since = f"{int((time.time() - settled) * 1000)}ms"
        scrapes = [int(s["value"][1]) for s in prom.series(f"count_over_time(up[{since}])")]
        return len(prom.series("up == 1")) == 2 and len(scrapes) == 2 and min(scrapes) >= 2
    wait_until(scraped_twice, 20, f"two scrapes of both targets (log: {prom.log})",
               interval=0.2)

    problems = []
    for where, query in all_queries():
        promql = TEMPLATE.sub(".*", query)
        for name, value in GRAFANA.items():
            promql = promql.replace(name, value)
        label_values = generator().LABEL_VALUES_RE.match(promql)
        if label_values:                                 # a variable: its values
            metric_name, selector, label = label_values.groups()
            promql = f"group by ({label}) ({metric_name}{selector or ''})"
        answer = prom.query(promql)
        if answer["status"] != "success":
            problems.append(f"{where}: {answer.get('error')}\n    {promql}")
        elif not answer["data"]["result"] and not generator().metric_names(promql) & set(
                ALLOWED_EMPTY):
            problems.append(f"{where}: no series\n    {promql}")
    assert not problems, "dashboard queries that fail against Prometheus:\n" + \
        "\n".join(problems)

    # The allowed-empty metrics are real families of the services' /metrics (a router's
    # family shows in its multiprocess /metrics once a worker wrote it; its registry in
    # a process of its own shows every family).
    texts = [requests.get(u + "/metrics", verify=c.ca_file, timeout=10).text
             for u in (c.control_url, c.router_url)]
    texts.append(RouterMetrics().render().decode())
    families = set(re.findall(r"^# TYPE (\S+) ", "\n".join(texts), re.M))
    read = {n for _, q in all_queries() for n in generator().metric_names(q)}
    for name in ALLOWED_EMPTY:
        assert name in read, f"{name} is allowed empty but no dashboard reads it"
        family = re.sub(r"_bucket$", "", name)
        assert family in families, f"{family} is no family of the services' /metrics"
