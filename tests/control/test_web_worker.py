"""The control service's web workers (control/worker.py, control/serve.py): gevent with the
router's HTTP/1.1 loop on PostgreSQL, gthread on SQLite; under gevent, psycopg2 waits on
the event loop (the worker keeps serving while a connection is being made), a connection
that gets no answer fails at its connect_timeout as libpq's own would, and each greenlet
keeps its own store wait bound. The gevent parts run in a child process: patching the
standard library is for a whole process."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.control.serve import WORKER, _Gunicorn
from llmgw_runtime.control.worker import DEFAULT_CONNECT_TIMEOUT_S, connect_timeout_s
from llmgw_runtime.errors import ConfigError
from llmgw_runtime.settings import load
from llmgw_runtime.store import Store
from tests.support.postgres import PostgresServer

ROOT = Path(__file__).resolve().parents[2]
PG = "postgresql://llmgw@127.0.0.1:5432/llmgw"


def worker_class(config: ControlConfig) -> str:
    return str(_Gunicorn(config).cfg.worker_class_str)


def test_postgresql_gets_gevent_workers_and_sqlite_gthread_ones(tmp_path: Path) -> None:
    assert worker_class(ControlConfig(state_dir=tmp_path)) == "gthread"
    assert worker_class(ControlConfig(state_dir=tmp_path, database_url=PG)) == WORKER
    assert worker_class(ControlConfig(state_dir=tmp_path, database_url=PG,
                                      web_worker="gthread")) == "gthread"


def test_a_web_worker_setting_that_cannot_work_is_refused_naming_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as bad:
        load(ControlConfig, env={"LLMGW_WEB_WORKER": "gevent",
                                 "LLMGW_STATE_DIR": str(tmp_path)})
    assert "LLMGW_WEB_WORKER=gevent needs PostgreSQL" in str(bad.value.details)
    with pytest.raises(ConfigError) as bad:
        load(ControlConfig, env={"LLMGW_WEB_WORKER": "threads"})
    assert "use one of auto, gevent, gthread" in str(bad.value.details)


def test_connect_timeout_is_read_as_libpq_reads_it() -> None:
    assert connect_timeout_s("host=a connect_timeout=5") == 5.0
    assert connect_timeout_s("host=a connect_timeout=1") == 2.0      # libpq's floor
    assert connect_timeout_s("host=a connect_timeout=0") is None     # no limit
    assert connect_timeout_s("host=a") == DEFAULT_CONNECT_TIMEOUT_S


def run_patched(body: str) -> str:
    """``body`` in a fresh Python that patched the standard library as a control worker
    does (ControlWorker.patch), the app's modules imported before, as in the server's
    master; its stdout."""
    code = textwrap.dedent("""
        from llmgw_runtime.control import app, summary_view
        from gevent import monkey
        monkey.patch_all()
        from llmgw_runtime.control.worker import after_patch
        from llmgw_runtime.store import failover
        after_patch()
        import gevent, time
    """) + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_store_that_never_answers_fails_at_connect_timeout_without_stopping_the_worker(
        ) -> None:
    # A server that accepts the connection and never says a word (a paused postmaster).
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        out = run_patched(f"""
            import psycopg2
            ticks = []
            def tick():
                while True:
                    ticks.append(1)
                    gevent.sleep(0.05)
            ticker = gevent.spawn(tick)
            started = time.monotonic()
            try:
                psycopg2.connect(host="127.0.0.1", port={silent.getsockname()[1]},
                                 user="x", dbname="x", connect_timeout=2)
            except psycopg2.OperationalError as exc:
                print("error", exc)
            print("took", round(time.monotonic() - started, 1), "ticks", len(ticks))
        """)
    finally:
        silent.close()
    error, took = out.splitlines()
    assert error == "error timeout expired"
    seconds, ticks = float(took.split()[1]), int(took.split()[3])
    assert 1.9 <= seconds < 4
    assert ticks >= 20          # the event loop ran while the connection waited


def test_each_greenlet_keeps_its_own_store_wait_bound() -> None:
    out = run_patched("""
        seen = {}
        def request(name, bound):
            failover.set_wait(bound)
            gevent.sleep(0.05)          # the other request sets its own meanwhile
            seen[name] = failover.wait_s()
        gevent.joinall([gevent.spawn(request, "a", 1.0), gevent.spawn(request, "b", 3.0)])
        print(seen["a"], seen["b"])
    """)
    assert out.split() == ["1.0", "3.0"]


def test_summaries_read_at_once_in_one_worker_both_answer(postgres: PostgresServer) -> None:
    """Two status requests in one gevent worker: the second waits its turn for the kept
    fleet while the first reads the store, on the event loop (an OS lock would stop it)."""
    url = postgres.create_database("summaries_at_once")
    Store(url).migrate()
    out = run_patched(f"""
        from llmgw_runtime.control.decide import Settings
        from llmgw_runtime.store import Store
        store = Store({url!r})
        def summary(name):
            with store.begin() as conn:
                rows = summary_view.read(conn, store.clock(conn), Settings())
            print(name, len(rows.nodes))
        gevent.joinall([gevent.spawn(summary, "a"), gevent.spawn(summary, "b")], timeout=20)
    """)
    assert sorted(out.split()) == ["0", "0", "a", "b"]


# A 1 ms ticker greenlet counts the event loop's turns while ``work()`` computes, in one go
# (checkpoints off) or in slices (on, as a control worker has them: llmgw_runtime/coop.py);
# its longest gap is how long a connection whose data arrived waited. What lives is frozen
# first, as a worker's keeper does (llmgw_runtime/gckeeper.py).
TICKED = """
        import gc
        from llmgw_runtime import coop
        gc.freeze()
        ticks = []
        def tick():
            while True:
                ticks.append(time.monotonic())
                gevent.sleep(0.001)
        ticker = gevent.spawn(tick)
        gevent.sleep(0.01)
        def ticked(how, work):
            coop.disable() if how == "whole" else coop.enable_gevent()
            first = len(ticks)
            result = work()
            turns = len(ticks) - first
            gevent.sleep(0.01)                  # the loop's first turn after it
            seen = ticks[first - 1:]
            gap = max(b - a for a, b in zip(seen, seen[1:]))
            print(how, turns, int(gap * 1000))
            return result
"""


def test_a_catalog_parsed_in_slices_leaves_the_event_loop_serving() -> None:
    """Parsing a catalog of 1,000 models holds the CPU for about 0.35 s: in one go the
    worker's event loop stops for all of it; with the worker's checkpoints on the loop has
    its turn at least every few milliseconds, and the parse's result and errors come back
    as they would."""
    out = run_patched(TICKED + """
        import json
        from llmgw_runtime.catalog import parse as catalog
        from llmgw_runtime.errors import CatalogError
        entries = [{"name": f"m-{i:04d}", "source": f"hf://o/m-{i:04d}/model.gguf",
                    "engine": "vllm", "profile": {"class": "a100-80g", "gpus": 1},
                    "replicas": 2} for i in range(1000)]
        text = json.dumps({"models": entries})
        for how in ("whole", "sliced"):
            print("models", len(ticked(how, lambda: catalog.parse(text, {}))))
        try:
            catalog.parse("models: [{name: 1}]", {})
        except CatalogError as exc:
            print("error", type(exc).__name__)
    """)
    whole, count1, sliced, count2, error = out.splitlines()
    assert count1 == count2 == "models 1000", out
    _, turns, gap_ms = sliced.split()
    # the loop's turns come every slice (5 ms) or so: at least one each 20 ms of what the
    # parse took in one go (0.1-0.35 s, by the machine's speed)
    whole_ms = int(whole.split()[2])
    assert int(whole.split()[1]) <= 1 and int(turns) >= max(3, whole_ms // 20), out
    # Slices of 5 ms; the longest wait left is libyaml composing the document (C, about
    # 50 ms), plus what a busy machine adds: under the whole parse's (bench/slices_bench.py
    # measures the requests' latency).
    assert int(gap_ms) < int(whole.split()[2]), out
    assert error == "error CatalogError"


def test_the_status_summary_of_a_large_fleet_leaves_the_event_loop_serving() -> None:
    """The summary every status view renders walks every node: at 5,000 nodes about a
    tenth of a second, which the worker's loop waited for in one go; with the worker's
    checkpoints on it has its turn between nodes, and the summary is the same."""
    out = run_patched(TICKED + """
        from llmgw_runtime.status import summary
        from tests.status.builders import big_fleet
        models, nodes, replicas = big_fleet(5000, 1000)
        answers = [ticked(how, lambda: summary.build(models, nodes, replicas, 1.8e9, 30.0))
                   for how in ("whole", "sliced")]
        print("same", answers[0] == answers[1])
    """)
    whole, sliced, same = out.splitlines()
    assert int(whole.split()[1]) <= 1 and int(sliced.split()[1]) >= 5, out
    assert int(sliced.split()[2]) < int(whole.split()[2]), out
    assert same == "same True"
