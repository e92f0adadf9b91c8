"""The supervisor with real engine processes (the tiny random GGUF via the xllamacpp
launcher), all on 127.0.0.1 and stopped by each test."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3

from llmgw_runtime.agent import Supervisor
from llmgw_runtime.agent.procs import pid_alive, proc_start_time
from llmgw_runtime.agent.supervisor import stop_recorded_engines
from llmgw_runtime.engines import drivers_from_config
from tests.support.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
http = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(total=10))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf")


def assignment(rid: str, source: str, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "replica_id": rid, "model": "tiny", "engine": "llama.cpp", "source": source,
        "args": ["--ctx-size", "256", "--threads", "1"], "devices": [0],
        "device_uuids": ["cpu-test"], "device_kind": "cpu"}
    base.update(over)
    return base


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(tmp_path / "run", drivers_from_config(), start_timeout_s=20,
                     stop_grace_s=5)
    try:
        yield sup
    finally:
        sup.stop_all()


def chat(port: int) -> dict[str, Any]:
    resp = http.request("POST", f"http://127.0.0.1:{port}/v1/chat/completions",
                        json={"model": "tiny", "max_tokens": 4,
                              "messages": [{"role": "user", "content": "hello"}]})
    assert resp.status == 200, resp.data
    return dict(resp.json())


def test_engine_starts_becomes_ready_answers_chat_and_stops_cleanly(
        supervisor: Supervisor, model: Path) -> None:
    state = supervisor.start(assignment("r-ok", f"file://{model}"))
    assert state["state"] == "starting" and state["pid"] and state["port"]
    state = supervisor.wait_for("r-ok", {"ready", "failed"}, timeout_s=20)
    assert state["state"] == "ready", state
    assert supervisor.states() == [state]
    assert chat(state["port"])["choices"][0]["message"]["role"] == "assistant"

    record = json.loads((supervisor.run_dir / "r-ok.json").read_text())
    assert record["pid"] == state["pid"] and record["port"] == state["port"]
    assert record["proc_start"] == proc_start_time(state["pid"])
    assert os.getpgid(state["pid"]) == state["pid"]  # its own session

    assert supervisor.stop("r-ok")
    assert not pid_alive(state["pid"])
    assert supervisor.states() == []
    assert list(supervisor.run_dir.iterdir()) == []


def test_bad_model_path_fails_with_the_engine_message(supervisor: Supervisor,
                                                      tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    supervisor.start(assignment("r-bad", str(missing)))
    state = supervisor.wait_for("r-bad", {"ready", "failed"}, timeout_s=20)
    assert state["state"] == "failed"
    assert f"model file not found: {missing}" in state["last_error"]
    assert "exited with code 2" in state["last_error"]
    assert "RuntimeWarning" not in state["last_error"]     # how the launcher is started
    assert not (supervisor.run_dir / "r-bad.json").exists()


def test_unknown_engine_and_unresolvable_source_fail_without_a_process(
        supervisor: Supervisor) -> None:
    a = supervisor.start(assignment("r-vllm", "/m.gguf", engine="vllm"))
    b = supervisor.start(assignment("r-s3", "s3://bucket/x.gguf"))
    assert a["state"] == "failed" and "'vllm' is not installed" in a["last_error"]
    assert b["state"] == "failed" and "'s3://bucket/x.gguf'" in b["last_error"]
    assert "not supported" in b["last_error"]
    assert a["pid"] is None and b["pid"] is None


def test_apply_starts_missing_and_stops_unassigned(supervisor: Supervisor,
                                                   model: Path) -> None:
    supervisor.apply([assignment("r-a", str(model))])
    first = supervisor.wait_for("r-a", {"ready", "failed"}, timeout_s=20)
    assert first["state"] == "ready"
    supervisor.apply([assignment("r-b", str(model))])
    assert [s["id"] for s in supervisor.states()] == ["r-b"]
    assert not pid_alive(first["pid"])


CHILD = textwrap.dedent("""
    import sys, time
    from llmgw_runtime.agent import Supervisor
    from llmgw_runtime.engines import drivers_from_config
    sup = Supervisor(sys.argv[1], drivers_from_config())
    sup.start({"replica_id": "r-adopt", "model": "tiny", "engine": "llama.cpp",
               "source": sys.argv[2], "args": ["--ctx-size", "256"], "devices": [0],
               "device_uuids": ["cpu-test"], "device_kind": "cpu"})
    state = sup.wait_for("r-adopt", {"ready", "failed"}, timeout_s=20)
    print(state["state"], state["pid"], state["port"], flush=True)
    time.sleep(300)
""")


def test_engine_survives_a_killed_agent_and_is_adopted_by_the_next(tmp_path: Path,
                                                                    model: Path) -> None:
    run_dir = tmp_path / "run"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir), str(model)],
                             cwd=REPO, stdout=subprocess.PIPE, text=True)
    pid = None
    try:
        assert child.stdout is not None
        state, pid_text, port_text = child.stdout.readline().split()
        assert state == "ready"
        pid, port = int(pid_text), int(port_text)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        time.sleep(0.2)
        assert pid_alive(pid)
        chat(port)

        sup = Supervisor(run_dir, drivers_from_config(), stop_grace_s=5)
        assert sup.adopt() == ["r-adopt"]
        (adopted,) = sup.states()
        assert adopted == {"id": "r-adopt", "model": "tiny", "state": "ready", "port": port,
                           "pid": pid, "last_error": None}
        sup.stop_all()
        assert not pid_alive(pid)
        assert list(run_dir.iterdir()) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if pid is not None and pid_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_stale_records_are_cleaned_at_adoption(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (run_dir / "r-dead.json").write_text(json.dumps({
        "replica_id": "r-dead", "model": "m", "pid": dead.pid, "port": 1, "argv": [],
        "started": 0, "proc_start": 1}))
    (run_dir / "r-dead.log").write_text("old\n")
    # pid reuse guard: a live pid (ours) whose start time does not match
    (run_dir / "r-reused.json").write_text(json.dumps({
        "replica_id": "r-reused", "model": "m", "pid": os.getpid(), "port": 1, "argv": [],
        "started": 0, "proc_start": (proc_start_time(os.getpid()) or 0) + 1}))
    (run_dir / "r-garbage.json").write_text("{not json")
    sup = Supervisor(run_dir, drivers_from_config())
    assert sup.adopt() == []
    assert sup.states() == []
    assert list(run_dir.iterdir()) == []


def test_up_stops_the_engines_its_agent_left_without_lines_that_read_like_a_start(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """`llmgw up` at Ctrl-C: the engines the agent left are stopped, the records and logs
    removed, and nothing printed says "adopted replica" or "is ready"."""
    engine = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "r-left.json").write_text(json.dumps({
            "replica_id": "r-left", "model": "tiny", "pid": engine.pid, "port": 1,
            "argv": [], "started": 0, "proc_start": proc_start_time(engine.pid)}))
        (run_dir / "r-left.log").write_text("engine output\n")
        caplog.set_level("DEBUG")
        assert stop_recorded_engines(tmp_path) == ["r-left (tiny)"]
        assert engine.wait(5) == -signal.SIGTERM
        assert list(run_dir.iterdir()) == []
        said = " | ".join(r.getMessage() for r in caplog.records)
        assert "adopted" not in said and "ready" not in said and "started" not in said, said
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait(5)


def test_missing_weights_are_fetched_first_and_progress_is_reported(
        tmp_path: Path, model: Path) -> None:
    """An https-style source with no local copy: the replica is `fetching` (with progress)
    while a slow loopback server sends the file, then the real engine starts on it."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    payload = model.read_bytes()

    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            for i in range(0, len(payload), len(payload) // 8 + 1):
                self.wfile.write(payload[i:i + len(payload) // 8 + 1])
                self.wfile.flush()
                time.sleep(0.15)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    weights = tmp_path / "weights"
    weights.mkdir()
    sup = Supervisor(tmp_path / "run", drivers_from_config(), start_timeout_s=20,
                     weights_dirs=[str(weights)])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/tiny.gguf"
        first = sup.start(assignment("r-fetch", url, size_bytes=len(payload)))
        assert first["state"] == "fetching"
        seen = sup.wait_for("r-fetch", ["starting", "ready", "failed"], 30, poll_s=0.05)
        assert seen["state"] != "failed", seen
        state = sup.wait_for("r-fetch", ["ready", "failed"], 30)
        assert state["state"] == "ready", state
        assert (weights / "tiny.gguf").read_bytes() == payload
        assert sup.downloads_finished() and not sup.downloads_finished()
        chat(state["port"])
    finally:
        sup.stop_all()
        server.shutdown()


def test_a_fetch_in_progress_reports_bytes_and_total(tmp_path: Path) -> None:
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    release = threading.Event()

    class Stuck(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "2000")
            self.end_headers()
            self.wfile.write(b"x" * 500)
            self.wfile.flush()
            release.wait(10)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stuck)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sup = Supervisor(tmp_path / "run", drivers_from_config(), start_timeout_s=20)
    try:
        sup.start(assignment("r-slow", f"http://127.0.0.1:{server.server_address[1]}/m.gguf"))
        deadline = time.monotonic() + 10
        while True:
            (state,) = sup.states()
            if (state.get("progress") or {}).get("bytes") == 500 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert state["state"] == "fetching"
        assert state["progress"]["bytes"] == 500 and state["progress"]["total"] == 2000
        assert not list((tmp_path / "weights").glob("m.gguf"))    # only the .part exists
    finally:
        release.set()
        sup.stop_all()
        server.shutdown()


def test_a_multi_node_head_waits_for_its_workers_then_fails_naming_them(
        tmp_path: Path, model: Path) -> None:
    import socket

    from llmgw_runtime.engines import LlamaCppDriver

    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\nexec sleep 30\n")
    binary.chmod(0o755)
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()                      # nothing listens there
    sup = Supervisor(tmp_path / "run", {"llama.cpp": LlamaCppDriver(str(binary))},
                     start_timeout_s=1.0)
    try:
        head = assignment("r-head", str(model), role="head", rank=0, nodes=2,
                          rendezvous_port=port,
                          peers=[{"rank": 0, "node": "a", "address": "127.0.0.1"},
                                 {"rank": 1, "node": "b", "address": "127.0.0.1"}])
        state = sup.start(head)
        assert state["state"] == "starting" and state["pid"] is None
        assert f"waiting for workers: 127.0.0.1:{port}" in state["last_error"]
        final = sup.wait_for("r-head", ["failed"], 10)
        assert final["state"] == "failed"
        assert f"127.0.0.1:{port} did not accept connections" in final["last_error"]
    finally:
        sup.stop_all()
