"""GET /metrics on the real router (serve.run: gunicorn, 2 gevent workers): counts and
timings add up across the workers, in-flight requests drain to 0, and model names a client
makes up do not become labels."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import harness
import pytest
import requests
from fake_control import FakeControl
from prometheus_client.parser import text_string_to_metric_families

from llmgw_runtime.router.app import create_app
from llmgw_runtime.router.config import RouterConfig

from .conftest import API_KEY, ROUTER_TOKEN

AUTH = {"Authorization": f"Bearer {API_KEY}"}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Router:
    def __init__(self, url: str, proc: subprocess.Popen[bytes], tmp: Path) -> None:
        self.url, self.proc, self.tmp = url, proc, tmp

    @property
    def metrics_dir(self) -> Path:
        [path] = self.tmp.glob("llmgw-router-metrics-*")
        return path

    def chat(self, model: str, **body: Any) -> requests.Response:
        return requests.post(self.url + "/v1/chat/completions", headers=AUTH, timeout=20,
                             json={"model": model, "messages": [], **body})

    def scrape(self) -> Samples:
        resp = requests.get(self.url + "/metrics", timeout=10)   # no API key needed
        assert resp.status_code == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(resp.text) for s in fam.samples}

    def settled(self) -> Samples:
        """A scrape once every answered request is accounted for: a worker counts a request
        when the server closes its answer, a moment after the client has it."""
        deadline = time.monotonic() + 5
        last = self.scrape()
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = self.scrape()
            in_flight = sum(v for (name, _), v in now.items()
                            if name == "llmgw_router_in_flight")
            if now == last and in_flight == 0:
                break
            last = now
        return last


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def models_labelled(samples: Samples, prefix: str) -> set[str]:
    return {dict(labels).get("model", "") for (name, labels) in samples
            if name.startswith(prefix)}


@pytest.fixture(scope="module")
def metered(control: FakeControl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    """A router of its own (so other tests' requests do not count), its temporary files
    under a directory this test can see."""
    tmp = tmp_path_factory.mktemp("router-tmp")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp))
        proc, url = harness.start_router(control.url, ROUTER_TOKEN, workers=2,
                                         refresh_interval_s=0.2, activation_timeout_s=2.0)
    router = Router(url, proc, tmp)
    try:
        yield router
    finally:
        harness.stop(proc)
    assert list(tmp.glob("llmgw-router-metrics-*")) == [], "metrics directory left behind"


def test_counts_and_timings_add_up_across_workers(metered: Router) -> None:
    sent = 0
    # New connections at once until both workers have counted something.
    for _ in range(20):
        with ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(lambda _: metered.chat("chat").status_code, range(32)))
        assert codes == [200] * 32
        sent += 32
        if len(list(metered.metrics_dir.glob("counter_*.db"))) == 2:
            break
    assert len(list(metered.metrics_dir.glob("counter_*.db"))) == 2, "one worker took it all"
    streams = [metered.chat("chat", stream=True, fake_chunks=3, fake_chunk_delay_s=0.25)
               for _ in range(2)]
    assert all(r.status_code == 200 and "[DONE]" in r.text for r in streams)
    assert metered.chat("parked").status_code == 503
    assert metered.chat("unplaceable").status_code == 503
    assert metered.chat("alldead").status_code == 502
    bad = requests.post(metered.url + "/v1/embeddings", data=b'{"model":', headers=AUTH,
                        timeout=10)
    assert bad.status_code == 400

    for _ in range(3):   # whichever worker answers the scrape, the totals are the same
        m = metered.settled()
        assert value(m, "llmgw_router_requests_total", model="chat", code="200") == sent + 2
        assert value(m, "llmgw_router_request_duration_seconds_count",
                     model="chat") == sent + 2
        assert value(m, "llmgw_router_time_to_first_byte_seconds_count",
                     model="chat") == sent + 2
        assert value(m, "llmgw_router_requests_total", model="parked", code="503") == 1
        assert value(m, "llmgw_router_errors_total", model="parked", code="model_parked") == 1
        assert value(m, "llmgw_router_errors_total", model="unplaceable",
                     code="model_unplaceable") == 1
        assert value(m, "llmgw_router_errors_total", model="alldead",
                     code="upstream_error") == 1
        assert value(m, "llmgw_router_requests_total", model="alldead", code="502") == 1
        assert value(m, "llmgw_router_errors_total", model="(unknown)",
                     code="invalid_json") == 1
        assert value(m, "llmgw_router_errors_total", model="chat", code="upstream_error") == 0
    # The streams took ~0.75 s to the last byte but sent their first after ~0.25 s.
    fast = value(m, "llmgw_router_request_duration_seconds_bucket", model="chat", le="0.5")
    assert fast <= sent
    assert value(m, "llmgw_router_time_to_first_byte_seconds_bucket", model="chat",
                 le="0.5") == sent + 2
    assert value(m, "llmgw_router_request_duration_seconds_sum", model="chat") >= 1.5
    assert value(m, "llmgw_router_in_flight", model="chat") == 0


def test_made_up_model_names_are_labelled_unknown(metered: Router) -> None:
    names = [f"nope-{i}-{time.time_ns()}" for i in range(5)]
    for name in names:
        resp = metered.chat(name)
        assert resp.status_code == 404 and resp.json()["error"]["code"] == "model_not_found"
    m = metered.scrape()
    assert value(m, "llmgw_router_requests_total", model="(unknown)", code="404") == 5
    assert value(m, "llmgw_router_errors_total", model="(unknown)",
                 code="model_not_found") == 5
    labelled = models_labelled(m, "llmgw_router_")
    assert not labelled & set(names)
    assert labelled <= {"chat", "parked", "unplaceable", "alldead", "(unknown)"}


def test_in_flight_counts_open_streams_and_drains_when_a_client_leaves(
        metered: Router) -> None:
    def in_flight() -> float:
        return value(metered.scrape(), "llmgw_router_in_flight", model="chat")

    before = metered.settled()
    open_streams = [_open_stream(metered.url) for _ in range(3)]
    assert in_flight() == 3
    for sock in open_streams:       # clients hang up mid-stream
        sock.close()
    deadline = time.monotonic() + 5
    while in_flight() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert in_flight() == 0
    # A client that leaves is counted as a cancellation, never as a router error.
    after = metered.settled()

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)
    assert grew("llmgw_router_client_cancelled_total", model="chat", when="streaming") == 3
    assert sum(v - before.get(k, 0.0) for k, v in after.items()
               if k[0] == "llmgw_router_errors_total") == 0


def _open_stream(url: str) -> socket.socket:
    """A slow stream whose first event has arrived."""
    body = json.dumps({"model": "chat", "stream": True, "fake_chunks": 20,
                       "fake_chunk_delay_s": 0.2}).encode()
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\n"
                 b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s"
                 % (host.encode(), API_KEY.encode(), len(body), body))
    seen = b""
    while b"data: " not in seen:
        data = sock.recv(65536)
        assert data, f"the router closed the stream: {seen!r}"
        seen += data
    assert seen.startswith(b"HTTP/1.1 200")
    return sock


def test_metrics_are_get_only_without_an_api_key_and_private_on_disk(metered: Router) -> None:
    assert requests.get(metered.url + "/metrics", timeout=10).status_code == 200
    resp = requests.post(metered.url + "/metrics", timeout=10)
    assert resp.status_code == 405 and resp.json()["error"]["code"] == "method_not_allowed"
    mode = stat.S_IMODE(os.stat(metered.metrics_dir).st_mode)
    assert mode == 0o700


def test_prometheus_client_is_not_imported_before_the_workers_fork() -> None:
    # It reads PROMETHEUS_MULTIPROC_DIR once, at import: serve.run must set it first.
    code = ("import sys; sys.argv = ['llmgw', 'router']\n"
            "import llmgw_runtime.cli.main, llmgw_runtime.router.serve\n"
            "print('prometheus_client' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=harness.ROOT)
    assert out.stdout.strip() == "False"


def test_an_app_made_in_process_counts_in_its_own_registry(control: FakeControl) -> None:
    apps = [create_app(RouterConfig(control_url=control.url, router_token=ROUTER_TOKEN,
                                    require_api_key=False)) for _ in range(2)]
    try:
        client = apps[0].test_client()
        resp = client.post("/v1/chat/completions", json={"model": "nope"})
        assert resp.status_code == 404
        resp.close()
        first = client.get("/metrics").get_data(as_text=True)
        second = apps[1].test_client().get("/metrics").get_data(as_text=True)
        assert 'llmgw_router_requests_total{code="404",model="(unknown)"} 1.0' in first
        assert "llmgw_router_requests_total{" not in second
    finally:
        for app in apps:
            app.extensions["llmgw_router"].routes.stop()


def _workers(master: int) -> set[int]:
    out = set()
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == master:
            out.add(int(stat_file.parent.name))
    return out


def test_a_killed_worker_leaves_nothing_in_flight_and_its_counts_stay(metered: Router) -> None:
    before = metered.settled()
    stream = _open_stream(metered.url)
    assert value(metered.scrape(), "llmgw_router_in_flight", model="chat") == 1
    old = _workers(metered.proc.pid)
    assert len(old) == 2
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    stream.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        new = _workers(metered.proc.pid)
        if len(new) == 2 and not new & old:
            break
        time.sleep(0.1)
    harness.wait_http(metered.url + "/metrics")
    after = metered.settled()
    assert value(after, "llmgw_router_in_flight", model="chat") == 0
    for name, labels in (("llmgw_router_requests_total", {"model": "chat", "code": "200"}),
                         ("llmgw_router_request_duration_seconds_count", {"model": "chat"})):
        assert value(after, name, **labels) == value(before, name, **labels) > 0
