"""The Molecule cluster scenario's node-maintenance check can fail (issue 27: the scenario
drains an agent node with playbooks/maintenance.yml while its request loop runs, and must
show 0 failed requests with a loop that overlapped the drain).

The scenario's own pieces, run here: molecule/cluster/files/request_loop.sh against a fake
router on loopback (a stream that ends without ``data: [DONE]`` is written as ``cut``, a
refusal as its status), molecule/cluster/files/rollout_requests.py counting a made-up
request log, and the assert task of the drain play of molecule/cluster/verify.yml (taken
from the file, run by ansible-playbook on this machine) judging the counts. A drain whose
requests were all answered passes; one that failed or cut requests, a loop that began after
the drain or ended before it, or a loop that stalled through it fails.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from .test_rollout_check import count_requests, request_log, run_check

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "molecule" / "cluster"
PLAY = "Verify | drain a node under load with playbooks/maintenance.yml"
CHECK = "Drain | every request succeeded, and requests were answered while the node drained"
START, END = 1_700_000_000.0, 1_700_000_040.0          # the maintenance playbook: 40 s

pytestmark = pytest.mark.slow


def counted(log: Path, loop_stopped: float) -> str:
    return count_requests(log, {"rollout": [START, END], "what": "maintenance",
                                "loop_stopped": loop_stopped, "agents": []})


def judge(tmp_path: Path, stdout: str) -> subprocess.CompletedProcess[str]:
    """verify.yml's drain check (and its play's vars) on ``counted.stdout``."""
    return run_check(tmp_path, lambda p: p.get("name") == PLAY, CHECK,
                     {"drain_start": START, "drain_end": END, "counted": {"stdout": stdout}})


def test_a_drain_answered_throughout_passes_and_reports_the_counts(tmp_path: Path) -> None:
    log = request_log(tmp_path / "requests.txt", START - 5, END + 10)
    out = counted(log, END + 10)
    summary = json.loads(out)
    assert summary["failed"] == 0
    assert summary["report"][1].startswith("during the 40.0 s maintenance: 160 sent, 160 "
                                           "answered, 0 failed")
    done = judge(tmp_path, out)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("log_from, log_to, dropped, why", [
    # a replica stopped under its requests: refused or cut while the node drained
    (START - 5, END + 10, {(START + 12, START + 14): "502"}, "summary.failed == 0"),
    (START - 5, END + 10, {(START + 12, START + 12.3): "cut"}, "summary.failed == 0"),
    (START - 5, END + 10, {(START + 12, START + 14): "000"}, "summary.failed == 0"),
    # the loop began after the playbook had begun, or ended before it ended
    (START + 5, END + 10, {}, "summary.first < drain_start"),
    (START - 5, START + 30, {}, "summary.last > drain_end"),
    # the loop stalled through the drain: sent nothing, so nothing failed
    (START - 5, END + 10, {(START + 1, END): None}, "summary.during_rollout.answered >="),
])
def test_a_drain_the_requests_did_not_get_through_fails(
        tmp_path: Path, log_from: float, log_to: float,
        dropped: dict[tuple[float, float], str | None], why: str) -> None:
    log = request_log(tmp_path / "requests.txt", log_from, log_to, dropped)
    done = judge(tmp_path, counted(log, log_to))
    assert done.returncode != 0, done.stdout
    assert f'"assertion": "{why}' in done.stdout, done.stdout       # that check, not another


# ------------------------------------------------------------ the loop's outcomes

class FakeRouter(BaseHTTPRequestHandler):
    """Answers chat completions as the router does; ``cut_streams``: streams end without
    ``data: [DONE]`` (a replica stopped under them); ``status``: refuse every request."""

    cut_streams = False
    status = 200
    bodies: list[dict] = []
    url = ""

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        if self.status != 200:
            self.send_response(self.status)
            self.end_headers()
            return
        self.send_response(200)
        if body.get("stream"):
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunk = {"object": "chat.completion.chunk", "choices": [{"delta": {"content": "hi"}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            if not self.cut_streams:
                self.wfile.write(b"data: [DONE]\n\n")
            return
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"object": "chat.completion", "choices": []}).encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def router() -> Iterator[type[FakeRouter]]:
    handler = type("Router", (FakeRouter,), {"bodies": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"
    yield handler
    server.shutdown()
    thread.join(5)


def run_loop(tmp_path: Path, url: str, requests: int = 4) -> list[str]:
    """request_loop.sh until it has sent ``requests``; the outcome of each."""
    if shutil.which("curl") is None:
        pytest.skip("request_loop.sh needs curl")
    (tmp_path / "key").write_text("sk-test")
    proc = subprocess.Popen(["bash", str(SCENARIO / "files" / "request_loop.sh"),
                             str(tmp_path), url, str(tmp_path / "no-ca.crt")])
    log = tmp_path / "requests.txt"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
            not log.exists() or len(log.read_text().splitlines()) < requests):
        time.sleep(0.05)
    (tmp_path / "stop").touch()
    proc.wait(30)
    assert (tmp_path / "done").exists()
    return [line.split()[1] for line in log.read_text().splitlines()]


def test_the_loop_streams_every_other_request_and_counts_whole_answers(
        tmp_path: Path, router: type[FakeRouter]) -> None:
    outcomes = run_loop(tmp_path, router.url)

    assert outcomes and set(outcomes) == {"200"}, outcomes
    streamed = [bool(b.get("stream")) for b in router.bodies]
    assert streamed[:4] == [False, True, False, True]


def test_the_loop_writes_a_stream_without_its_end_as_cut(
        tmp_path: Path, router: type[FakeRouter]) -> None:
    router.cut_streams = True

    outcomes = run_loop(tmp_path, router.url)

    assert outcomes[:4] == ["200", "cut", "200", "cut"], outcomes


def test_the_loop_writes_a_refusal_as_its_status(
        tmp_path: Path, router: type[FakeRouter]) -> None:
    router.status = 503

    outcomes = run_loop(tmp_path, router.url)

    assert set(outcomes) == {"503"}, outcomes
