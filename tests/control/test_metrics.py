"""GET /metrics on the control service: what Prometheus (and the alert rules) see, on both
store backends."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from llmgw_runtime.api.agent import Report
from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.control.metrics import certificate_not_after, render
from llmgw_runtime.control.reconcile import Reconciler
from llmgw_runtime.store import Store, repo
from llmgw_runtime.store.schema import nodes
from tests.support.certs import make_pki

from .conftest import ADMIN, CPU, JOIN, ROUTER, Api

CATALOG = """models:
  - {name: tiny, source: file:///m/tiny.gguf, engine: llama.cpp, profile: {class: cpu}}
  - {name: big, source: file:///m/big.gguf, engine: vllm, replicas: 2,
     profile: {class: h100-80g}}
  - {name: broken, source: file:///m/broken.gguf, engine: vllm, replicas: 3,
     profile: {class: h100-80g}}
  - {name: lazy, source: file:///m/lazy.gguf, engine: llama.cpp, on_demand: true,
     profile: {class: cpu}}
"""
MIG = {"id": 1100, "uuid": "MIG-1", "card": 1, "mig": 0, "class": "a100-80g-mig-3g.40gb",
       "memory_total_mb": 40192, "memory_used_mb": 13, "temperature_c": 41,
       "power_w": None, "healthy": True, "reason": None}
SICK = {"id": 2, "uuid": "GPU-2", "card": 2, "mig": None, "class": "l4-24g",
        "memory_total_mb": 23034, "memory_used_mb": 0, "temperature_c": 90, "power_w": 72.5,
        "healthy": False, "reason": "XID 79: fallen off the bus"}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: Any, token: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = client.get("/metrics", headers=headers)
    assert resp.status_code == 200, resp.get_data(as_text=True)
    assert resp.content_type.startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(resp.get_data(as_text=True))
            for s in fam.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in samples.items() if n == name}


@pytest.fixture
def fleet(api: Api) -> Api:
    """tiny ready on n1; big unplaceable; broken parked; lazy idle on demand; n2 silent for
    100 s; n3 joined but never reported."""
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    cred = api.join("n1")
    api.report(cred, devices=[CPU, MIG, SICK], engines=["llama.cpp", "vllm"])
    api.join("n2")
    api.join("n3")
    with api.store.begin() as conn:
        repo.update_model(conn, "broken", parked=1, consecutive_failures=5,
                          last_error="CUDA out of memory")
        repo.record_report(conn, "n2", Report.model_validate(
            {"node": "n2", "devices": [CPU], "engines": ["llama.cpp"]}), time.time() - 100)
    assert api.reconciler.run_cycle()
    [assignment] = api.report(cred, devices=[CPU, MIG, SICK]).json["assignments"]
    api.report(cred, devices=[CPU, MIG, SICK], engines=["llama.cpp", "vllm"],
               replicas=[{"id": assignment["replica_id"], "state": "ready", "port": 41000,
                          "pid": 7}])
    with api.store.begin() as conn:
        # the planner leaves a parked model alone; a stale reason must not count
        repo.update_model(conn, "broken", placement_reason="no h100-80g")
        repo.add_replica(conn, "r-old", "tiny", "n2", (0,), time.time())
        repo.update_replica(conn, "r-old", state="stopping", desired=0)
    return api


def test_models_show_desired_ready_parked_and_why_unplaceable(fleet: Api) -> None:
    m = scrape(fleet.client)
    assert series(m, "llmgw_model_desired_replicas") == {
        (("model", "big"),): 2, (("model", "broken"),): 3, (("model", "lazy"),): 0,
        (("model", "tiny"),): 1}
    assert series(m, "llmgw_model_ready_replicas") == {
        (("model", "big"),): 0, (("model", "broken"),): 0, (("model", "lazy"),): 0,
        (("model", "tiny"),): 1}
    assert value(m, "llmgw_model_parked", model="broken") == 1
    assert value(m, "llmgw_model_parked", model="tiny") == 0
    assert value(m, "llmgw_model_consecutive_failures", model="broken") == 5
    reason = fleet.call("GET", "/api/v1/models/big", ADMIN).json["reason"]
    assert reason and "h100-80g" in reason
    assert series(m, "llmgw_model_unplaceable") == {
        (("model", "big"), ("reason", reason)): 1,
        (("model", "broken"), ("reason", "")): 0,     # parked wins over a stale reason
        (("model", "lazy"), ("reason", "")): 0, (("model", "tiny"), ("reason", "")): 0}


def test_desired_matches_what_ctl_status_wants_except_parked(fleet: Api) -> None:
    m = scrape(fleet.client)
    status = fleet.call("GET", "/api/v1/status", ADMIN).json
    for model in status["models"]:
        want = 3 if model["name"] == "broken" else model["wanted"]
        assert value(m, "llmgw_model_desired_replicas", model=model["name"]) == want
        assert value(m, "llmgw_model_ready_replicas", model=model["name"]) == model["ready"]


def test_reasons_with_quotes_and_newlines_survive_exposition(fleet: Api) -> None:
    reason = 'needs "2" nodes in ib-a\\b;\nib-a has 1 free'
    with fleet.store.begin() as conn:
        repo.update_model(conn, "big", placement_reason=reason)
    m = scrape(fleet.client)
    assert value(m, "llmgw_model_unplaceable", model="big", reason=reason) == 1
    # the fast renderer and prometheus_client's own agree on the same families
    families = list(fleet.client.application.extensions["llmgw.metrics"].collect())
    once = CollectorRegistry(auto_describe=False)
    once.register(_Fixed(families))
    ours, theirs = (
        {(s.name, tuple(sorted(s.labels.items())), s.value)
         for f in text_string_to_metric_families(text.decode()) for s in f.samples}
        for text in (render(once), generate_latest(once)))
    assert ours == theirs


def test_replicas_by_state_always_list_every_state(fleet: Api) -> None:
    m = scrape(fleet.client)
    assert series(m, "llmgw_replicas") == {
        (("state", "pending"),): 0, (("state", "fetching"),): 0, (("state", "starting"),): 0,
        (("state", "ready"),): 1, (("state", "failed"),): 0, (("state", "stopping"),): 1,
        (("state", "unreachable"),): 0}


def test_nodes_reporting_age_and_engines(fleet: Api) -> None:
    m = scrape(fleet.client)
    assert series(m, "llmgw_node_reporting") == {
        (("node", "n1"),): 1, (("node", "n2"),): 0, (("node", "n3"),): 0}
    ages = series(m, "llmgw_node_last_report_age_seconds")
    assert set(ages) == {(("node", "n1"),), (("node", "n2"),)}   # n3 never reported
    assert ages[(("node", "n1"),)] < 10 and 100 <= ages[(("node", "n2"),)] < 110
    assert series(m, "llmgw_node_engine_installed") == {
        (("engine", "llama.cpp"), ("node", "n1")): 1, (("engine", "vllm"), ("node", "n1")): 1,
        (("engine", "llama.cpp"), ("node", "n2")): 1}


def test_devices_health_memory_temperature_and_power(fleet: Api) -> None:
    m = scrape(fleet.client)
    mig = {"node": "n1", "device": "1/mig0", "class": "a100-80g-mig-3g.40gb"}
    sick = {"node": "n1", "device": "2", "class": "l4-24g"}
    assert value(m, "llmgw_device_healthy", **mig) == 1
    assert value(m, "llmgw_device_healthy", **sick) == 0
    assert value(m, "llmgw_device_healthy", node="n2", device="0", **{"class": "cpu"}) == 1
    assert value(m, "llmgw_device_memory_total_bytes", **mig) == 40192 * 1024 * 1024
    assert value(m, "llmgw_device_memory_used_bytes", **mig) == 13 * 1024 * 1024
    assert value(m, "llmgw_device_temperature_celsius", **mig) == 41
    assert value(m, "llmgw_device_power_watts", **sick) == 72.5
    # a value the device does not report is absent, never 0
    assert value(m, "llmgw_device_power_watts", **mig) is None
    assert value(m, "llmgw_device_temperature_celsius", node="n1", device="0",
                 **{"class": "cpu"}) is None


def test_leader_is_one_only_on_the_instance_holding_the_lease(api: Api, store: Store,
                                                              tmp_path: Path) -> None:
    instance = api.config.instance
    assert value(scrape(api.client), "llmgw_leader", instance=instance) == 0
    assert Reconciler(store, api.config).run_cycle()
    assert value(scrape(api.client), "llmgw_leader", instance=instance) == 1
    other = create_app(ControlConfig(state_dir=tmp_path, instance_name="ctl-b"), store_=store)
    m = scrape(other.test_client())
    assert series(m, "llmgw_leader") == {(("instance", "ctl-b"),): 0}


def test_every_gunicorn_worker_of_the_leading_instance_says_leader(
        api: Api, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # gunicorn sets SERVER_SOFTWARE in its master; workers share the master's pid as parent
    monkeypatch.setenv("SERVER_SOFTWARE", "gunicorn/27.0.1")
    config = ControlConfig(state_dir=tmp_path)
    assert config.instance == f"{socket.gethostname()}:{os.getppid()}"
    leader = Reconciler(store, config)        # the worker that won the lease
    assert leader.run_cycle()
    worker = create_app(config, store_=store)  # another worker of the same instance
    assert value(scrape(worker.test_client()), "llmgw_leader", instance=config.instance) == 1


def test_certificate_expiry_is_read_from_disk(store: Store, tmp_path: Path) -> None:
    ca = make_pki(tmp_path / "pki", names=("control",))
    cert = str(tmp_path / "pki" / "control.crt")
    config = ControlConfig(state_dir=tmp_path, tls_cert=cert,
                           tls_key=str(tmp_path / "pki" / "control.key"), ca_file=str(ca))
    client = create_app(config, store_=store).test_client()
    expiry = series(scrape(client), "llmgw_certificate_expiry_seconds")
    assert set(expiry) == {(("path", cert),), (("path", str(ca)),)}
    assert all(86_000 < v <= 86_400 for v in expiry.values())     # make_pki: one day
    _expired_cert(Path(cert), days_ago=2)                           # renewed... badly
    assert -2 * 86_400 - 60 < value(scrape(client), "llmgw_certificate_expiry_seconds",
                                    path=cert) < -2 * 86_400 + 60  # type: ignore[operator]


def test_certificate_expiry_without_cryptography_falls_back_to_ssl(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_pki(tmp_path, names=("control",))
    path = str(tmp_path / "control.crt")
    with_cryptography = certificate_not_after(path)
    monkeypatch.setitem(sys.modules, "cryptography", None)   # import now fails
    assert abs(certificate_not_after(path) - with_cryptography) < 1


def test_no_tls_no_certificate_metric(api: Api) -> None:
    assert series(scrape(api.client), "llmgw_certificate_expiry_seconds") == {}


def test_metrics_are_open_by_default_and_need_the_token_when_one_is_set(
        store: Store, tmp_path: Path) -> None:
    config = ControlConfig(state_dir=tmp_path, metrics_token="llmgw-metrics-s3cret")
    client = create_app(config, store_=store).test_client()
    refused = client.get("/metrics")
    assert refused.status_code == 401
    assert "LLMGW_METRICS_TOKEN" in refused.json["error"]["message"]
    for wrong in (ADMIN, JOIN, ROUTER, "llmgw-metrics-s3cre"):
        assert client.get("/metrics", headers={"Authorization": f"Bearer {wrong}"}
                          ).status_code == 401
    assert value(scrape(client, "llmgw-metrics-s3cret"), "llmgw_replicas", state="ready") == 0


class _Fixed(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def _expired_cert(path: Path, days_ago: int) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "control")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=days_ago + 30))
            .not_valid_after(now - dt.timedelta(days=days_ago))
            .sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(Encoding.PEM))


def test_rollouts_drains_and_cordons_as_prometheus_sees_them(fleet: Api) -> None:
    """tiny's new definition failed (rollout failed 1), its replica drains, 3 requests
    were cut by drain timeouts before; n2 is cordoned, n3 draining (issue 27)."""
    now = time.time()
    with fleet.store.begin() as conn:
        repo.update_model(conn, "tiny", rollout_state=json.dumps(
            {"state": "failed", "since": now - 60, "error": "boom", "cut": 3}))
        repo.update_model(conn, "lazy", rollout_state=json.dumps({"state": "canary",
                                                                  "since": now}))
        [ready] = [r for r in repo.list_replicas(conn) if r.state == "ready"]
        repo.update_replica(conn, ready.id, drain_since=now - 2, drain_reason="idle stop",
                            drain_timeout_s=120.0)
        conn.execute(nodes.update().where(nodes.c.name == "n2").values(cordoned=1))
        conn.execute(nodes.update().where(nodes.c.name == "n3").values(
            cordoned=1, drain=json.dumps({"since": now, "force": False, "by": "admin",
                                          "total": 1})))
    m = scrape(fleet.client)
    assert series(m, "llmgw_model_rollout_failed") == {
        (("model", "big"),): 0, (("model", "broken"),): 0, (("model", "lazy"),): 0,
        (("model", "tiny"),): 1}
    assert {labels: v for labels, v in series(m, "llmgw_model_rollout_state").items()
            if v} == {(("model", "big"), ("state", "none")): 1,
                      (("model", "broken"), ("state", "none")): 1,
                      (("model", "lazy"), ("state", "canary")): 1,
                      (("model", "tiny"), ("state", "failed")): 1}
    assert len(series(m, "llmgw_model_rollout_state")) == 4 * 4
    assert value(m, "llmgw_replicas_draining", model="tiny") == 1
    assert value(m, "llmgw_replicas_draining", model="big") == 0
    assert value(m, "llmgw_drain_cut_requests_total", model="tiny") == 3
    assert value(m, "llmgw_drain_cut_requests_total", model="big") == 0
    assert series(m, "llmgw_node_cordoned") == {
        (("node", "n1"),): 0, (("node", "n2"),): 1, (("node", "n3"),): 1}
    assert series(m, "llmgw_node_draining") == {
        (("node", "n1"),): 0, (("node", "n2"),): 0, (("node", "n3"),): 1}
