"""Benchmark of the control service under agent load, against a real PostgreSQL.

    .venv/bin/python bench/control_bench.py [--quick] [--workers 2,4x2] [--profile]

Starts PostgreSQL (tests/support/postgres.py) and the real control service (`llmgw server`,
gunicorn gthread; the production WORKERSxTHREADS unless --workers), joins simulated agents
(bench/agent_sim.py: eight fake A100-80GB devices each), applies a catalog of 1,000 models x
2 replicas (the reconciler places 2,000 replicas, which the agents then report ready), and
steps the reporting fleet through 250, 500, 1,000 and 2,000 agents, each reporting every
5 s, open loop, measured three periods after it grew (the joining agents' first reports,
written in full, settle first). Per step it prints target and achieved reports/s, p50/p95/p99 latency from
the scheduled send time, errors, the CPU each part used and CPU ms per report; it stops
stepping once a step saturates. --profile wraps the server's report handler and reconcile
cycle in cProfile and prints the top costs. Stops every process it started, also on Ctrl-C
or SIGTERM. Exits 0 (1 with --strict when 2,000 agents at p99 < 100 ms is missed).
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import secrets  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import gevent  # noqa: E402

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

import agent_sim  # noqa: E402
from agent_sim import Fleet, Window  # noqa: E402

from llmgw_runtime.control.config import ControlConfig  # noqa: E402
from tests.support.postgres import PostgresServer  # noqa: E402
from tests.support.procs import descendants, free_port  # noqa: E402

DEFAULT = ControlConfig()
PERIOD_S = 5.0
TARGET_AGENTS, TARGET_P99_MS = 2000, 100.0
SETTLE_PERIODS = 3          # report periods between growing the fleet and measuring it
HOST = "127.0.0.1"

# The real server, with a cProfile per thread around each report and each reconcile cycle;
# every worker writes report-PID.prof and reconcile-PID.prof into argv[1] when it exits.
_PROFILED_MAIN = """
import cProfile, os, sys, threading
from llmgw_runtime import settings
from llmgw_runtime.control import reconcile, serve
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.store import Store
OUT, local, profs, lock = sys.argv[1], threading.local(), [], threading.Lock()
def prof(kind):
    p = getattr(local, kind, None)
    if p is None:
        p = cProfile.Profile(); setattr(local, kind, p)
        with lock: profs.append((kind, p))
    return p
def profiled(kind, fn, *args):
    p = prof(kind); p.enable()
    try: return fn(*args)
    finally: p.disable()
class Profiled:
    def __init__(self, app): self.app = app
    def __call__(self, environ, start):
        if environ.get("PATH_INFO") != "/api/v1/agent/report": return self.app(environ, start)
        return profiled("report", lambda: list(self.app(environ, start)))
run_cycle = reconcile.Reconciler.run_cycle
reconcile.Reconciler.run_cycle = lambda self: profiled("reconcile", run_cycle, self)
def dump(arbiter, worker):
    for kind in ("report", "reconcile"):
        for i, (k, p) in enumerate(profs):
            if k == kind: p.dump_stats(f"{OUT}/{kind}-{os.getpid()}-{i}.prof")
class G(serve._Gunicorn):
    def load_config(self):
        super().load_config(); self.cfg.set("worker_exit", dump)
    def load(self):
        app = super().load(); app.wsgi_app = Profiled(app.wsgi_app); return app
config = settings.load(ControlConfig)
store = Store(config.store_url); bootstrap(store, config); store.dispose()
G(config).run()
"""


def catalog_json(models: int, replicas: int) -> bytes:
    entries = [{"name": f"bench-{i:04d}", "source": f"hf://bench/model-{i:04d}/model.gguf",
                "engine": "vllm", "profile": {"class": agent_sim.CLASS, "gpus": 1},
                "replicas": replicas, "args": ["--max-model-len", "8192"]}
               for i in range(models)]
    return json.dumps({"models": entries}).encode()


class Control:
    """`llmgw server` (or the profiled variant) in its own session, logging to a file."""

    def __init__(self, store_url: str, shape: tuple[int, int] | None, workdir: Path,
                 profile_dir: Path | None) -> None:
        self.port = free_port()
        self.admin_token = "llmgw-admin-" + secrets.token_urlsafe(16)
        self.join_token = "llmgw-join-" + secrets.token_urlsafe(16)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        env.update(LLMGW_HOST=HOST, LLMGW_PORT=str(self.port), LLMGW_DATABASE_URL=store_url,
                   LLMGW_STATE_DIR=str(workdir), LLMGW_ADMIN_TOKEN=self.admin_token,
                   LLMGW_JOIN_TOKEN=self.join_token,
                   LLMGW_ROUTER_TOKEN="llmgw-router-" + secrets.token_urlsafe(16),
                   LLMGW_REPORT_INTERVAL_S=str(PERIOD_S), PYTHONPATH=str(ROOT),
                   # The simulated agents claim 10.x addresses and report from loopback.
                   LLMGW_AGENT_NETWORKS="10.0.0.0/8")
        if shape:
            env.update(LLMGW_WORKERS=str(shape[0]), LLMGW_THREADS=str(shape[1]))
        argv = [sys.executable, "-c", _PROFILED_MAIN, str(profile_dir)] if profile_dir \
            else [sys.executable, "-m", "llmgw_runtime.cli.main", "server"]
        self.log = workdir / "control.log"
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(argv, env=env, cwd=str(workdir), stdout=fh,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + 60
        while self.call("GET", "/healthz", b"", "-")[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the control service did not start:\n" + self.tail())
            time.sleep(0.2)

    def call(self, method: str, path: str, body: bytes, token: str | None = None,
             content_type: str = "application/json") -> tuple[int, bytes]:
        try:
            return agent_sim.request(HOST, self.port, method, path, body,
                                     token or self.admin_token, content_type)
        except OSError:
            return 0, b""

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def machine_ticks() -> int:
    """Busy clock ticks of all CPUs together (everything but idle and iowait)."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:]]
    return sum(ticks[:8]) - ticks[3] - ticks[4]


def cpu_ticks(root: int) -> int:
    """CPU time of ``root`` and its descendants, in clock ticks; children that exited and
    were reaped (PostgreSQL backends, pool connections) count through cutime/cstime."""
    total = 0
    for pid in {root} | descendants(root):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15])
        except (OSError, ValueError, IndexError):
            continue
    return total


@dataclass
class Step:
    workers: str                            # the server's shape, WORKERSxTHREADS
    agents: int
    window: Window
    reconnects: int                         # kept-alive connections the server closed
    cpu: dict[str, float]                   # part -> % of one core; other: the rest of the box

    @property
    def target(self) -> float:
        return self.agents / PERIOD_S

    def cpu_per_report(self, part: str) -> float:
        """CPU milliseconds ``part`` spent per answered report (the reconciler included)."""
        return self.cpu[part] * 10 / self.window.rate if self.window.rate else float("nan")

    @property
    def errors(self) -> int:
        return sum(self.window.errors.values()) + self.window.late

    @property
    def meets(self) -> bool:
        return self.window.pct(99) * 1000 < TARGET_P99_MS and not self.errors \
            and self.window.rate >= 0.95 * self.target


def wait_placed(control: Control, expected: int, timeout_s: float) -> float:
    started = time.monotonic()
    last = ""
    while time.monotonic() - started < timeout_s:
        status, body = control.call("GET", "/api/v1/replicas", b"")
        if status == 200:
            states = [r["state"] for r in json.loads(body)["replicas"]]
            ready = states.count("ready")
            last = f"{len(states)} replicas, {ready} ready"
            if len(states) >= expected and ready == len(states):
                return time.monotonic() - started
        gevent.sleep(1.0)
    raise RuntimeError(f"replicas not all placed and ready after {timeout_s:.0f} s: {last}")


def run_config(pg: PostgresServer, shape: tuple[int, int] | None, args: argparse.Namespace,
               workdir: Path, profile_dir: Path | None) -> list[Step]:
    workers, threads = shape or (DEFAULT.workers, DEFAULT.threads)
    label = f"{workers}x{threads}"
    url = pg.create_database(f"bench_{secrets.token_hex(4)}")
    wdir = Path(tempfile.mkdtemp(prefix=f"control-{label}-", dir=workdir))
    control = Control(url, shape, wdir, profile_dir)
    fleet = Fleet(HOST, control.port, control.join_token, PERIOD_S, args.shared_weights)
    steps: list[Step] = []
    try:
        fleet.join(max(args.steps))                   # on an idle server: joins are quick
        fleet.grow(args.steps[0])
        gevent.sleep(PERIOD_S + 1)                    # every node has reported its devices
        status, body = control.call("PUT", "/api/v1/catalog",
                                    catalog_json(args.models, 2), content_type="application/yaml")
        if status != 200:
            raise RuntimeError(f"applying the catalog failed: HTTP {status} {body[:300]!r}")
        took = wait_placed(control, args.models * 2, 240)
        print(f"[{label}] {args.models} models, {args.models * 2} replicas placed and "
              f"ready in {took:.0f} s", flush=True)
        pg_pid = int((pg.data / "postmaster.pid").read_text().split()[0])
        for n in args.steps:
            fleet.grow(n)
            # Settle: the first report of each agent that just joined is written in full
            # (and queues behind the others); the steady fleet is what is measured.
            gevent.sleep(PERIOD_S * SETTLE_PERIODS)
            before = (cpu_ticks(control.proc.pid), cpu_ticks(pg_pid), sum(os.times()[:2]),
                      machine_ticks())
            reconnects, start = fleet.record.reconnects, time.perf_counter()
            gevent.sleep(args.duration)
            end = time.perf_counter()
            after = (cpu_ticks(control.proc.pid), cpu_ticks(pg_pid), sum(os.times()[:2]),
                     machine_ticks())
            gevent.sleep(min(PERIOD_S, 2.0))          # let the window's last answers arrive
            hz, span = os.sysconf("SC_CLK_TCK"), end - start
            cpu = {"control": (after[0] - before[0]) / hz / span * 100,
                   "postgres": (after[1] - before[1]) / hz / span * 100,
                   "loadgen": (after[2] - before[2]) / span * 100,
                   "machine": (after[3] - before[3]) / hz / span * 100}
            cpu["other"] = cpu["machine"] - cpu["control"] - cpu["postgres"] - cpu["loadgen"]
            step = Step(label, n, agent_sim.window(fleet, start, end),
                        fleet.record.reconnects - reconnects, cpu)
            steps.append(step)
            print(row(step), flush=True)
            if step.window.rate < 0.9 * step.target or step.window.late:
                print(f"[{label}] saturated at {n} agents; not stepping further", flush=True)
                break
    finally:
        fleet.stop()
        control.stop()
    if steps and control.proc.returncode not in (0, -signal.SIGTERM):
        print(f"[{label}] control exited with {control.proc.returncode}:\n"
              + control.tail(), flush=True)
    return steps


HEADER = (f"{'workers':>7} {'agents':>6} {'target/s':>8} {'achieved/s':>10} {'p50 ms':>8} "
          f"{'p95 ms':>8} {'p99 ms':>8} {'errors':>6}  cpu% control/postgres/loadgen/other"
          "  CPU ms/report control+postgres")


def row(s: Step) -> str:
    w = s.window
    errs = ", ".join(f"{k} x{v}" for k, v in w.errors.items())
    errs += f"{', ' if errs else ''}{w.late} unanswered" if w.late else ""
    errs += f"{', ' if errs else ''}{s.reconnects} reconnects" if s.reconnects else ""
    return (f"{s.workers:>7} {s.agents:>6} {s.target:>8.0f} {w.rate:>10.1f} "
            f"{w.pct(50) * 1000:>8.1f} {w.pct(95) * 1000:>8.1f} {w.pct(99) * 1000:>8.1f} "
            f"{s.errors:>6}  {s.cpu['control']:.0f}/{s.cpu['postgres']:.0f}/"
            f"{s.cpu['loadgen']:.0f}/{s.cpu['other']:.0f}  {s.cpu_per_report('control'):.1f}+"
            f"{s.cpu_per_report('postgres'):.1f}" + (f"  ({errs})" if errs else ""))


def summary(steps: list[Step]) -> bool:
    """Print where each configuration saturates; True when the target is met."""
    met = False
    for label in dict.fromkeys(s.workers for s in steps):
        mine = [s for s in steps if s.workers == label]
        good = [s for s in mine if s.meets]
        bad = [s for s in mine if not s.meets]
        best = max((s.agents for s in good), default=0)
        met |= best >= TARGET_AGENTS
        first_bad = f"; misses from {bad[0].agents} agents ({bad[0].target:.0f}/s: p99 " \
            f"{bad[0].window.pct(99) * 1000:.0f} ms, {bad[0].window.rate:.0f}/s achieved, " \
            f"{bad[0].errors} errors)" if bad else ""
        print(f"{label}: p99 < {TARGET_P99_MS:.0f} ms up to {best} agents "
              f"({best / PERIOD_S:.0f} reports/s){first_bad}")
    print(f"target {TARGET_AGENTS} agents ({TARGET_AGENTS / PERIOD_S:.0f} reports/s) at p99 < "
          f"{TARGET_P99_MS:.0f} ms: {'met' if met else 'MISSED'}")
    return met


def print_profile(profile_dir: Path) -> None:
    for kind, top in (("report", 30), ("reconcile", 15)):
        files = sorted(str(p) for p in profile_dir.glob(f"{kind}-*.prof"))
        if not files:
            print(f"no {kind} profile was written (see the control log)")
            continue
        stats = pstats.Stats(*files)
        merged = profile_dir / f"{kind}.prof"
        stats.dump_stats(str(merged))
        for order in ("tottime", "cumulative"):
            print(f"\n=== {kind}: top {top} by {order} ({merged}) ===")
            stats.sort_stats(order).print_stats(top)


def bench(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-control-bench-"))
    profile_dir = Path(args.profile_dir or tempfile.mkdtemp(prefix="llmgw-control-prof-")) \
        if args.profile else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    pg = PostgresServer()
    steps: list[Step] = []
    try:
        pg.start()
        print(f"PostgreSQL on 127.0.0.1:{pg.port}; control service WORKERSxTHREADS (default "
              f"{DEFAULT.workers}x{DEFAULT.threads}); agents report every {PERIOD_S:.0f} s; "
              f"{args.duration:.0f} s per step{'; PROFILED' if profile_dir else ''}", flush=True)
        for shape in args.workers:
            steps += run_config(pg, shape, args, workdir, profile_dir)
    finally:
        pg.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print("\n" + HEADER)
    for step in steps:
        print(row(step))
    print()
    met = summary(steps)
    if profile_dir:
        print_profile(profile_dir)
    return 1 if args.strict and not met else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 steps of 5 s (a smoke check)")
    ap.add_argument("--workers", default="",
                    help="server shapes to compare, WORKERS[xTHREADS] each, e.g. 2,4,4x2 "
                         f"[the production default, {DEFAULT.workers}x{DEFAULT.threads}]")
    ap.add_argument("--steps", default="", help="agent counts [250,500,1000,2000]")
    ap.add_argument("--duration", type=float, default=0.0, help="seconds per step [20]")
    ap.add_argument("--models", type=int, default=1000, help="models (2 replicas each)")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the report handler and the reconcile cycle (default steps: "
                         "250 then 1,000 agents = 200 reports/s) and print the top costs")
    ap.add_argument("--profile-dir", default="", help="where to keep the .prof files")
    ap.add_argument("--shared-weights", action="store_true",
                    help="agents see every catalog source on shared storage (NFS), so each "
                         "report lists 1,000 weights [local disks: only their own]")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    args = ap.parse_args(argv)
    default_steps = "250,1000" if args.profile else "250,1000" if args.quick else \
        "250,500,1000,2000"
    args.steps = [int(x) for x in (args.steps or default_steps).split(",")]
    args.duration = args.duration or (5.0 if args.quick else 20.0)
    args.workers = [(int(w), int(t or DEFAULT.threads)) for w, _, t in
                    (x.partition("x") for x in args.workers.split(","))] \
        if args.workers else [None]
    need = -(-args.models * 2 // agent_sim.GPUS)
    if args.steps[0] < need:
        ap.error(f"the first step needs at least {need} agents to hold {args.models * 2} "
                 "one-GPU replicas")
    return args


def main() -> int:
    args = parse_args()
    job = gevent.spawn(bench, args)
    stopped: list[int] = []

    def stop() -> None:
        stopped.append(1)
        job.kill(block=False)                         # its finally blocks stop everything

    gevent.signal_handler(signal.SIGTERM, stop)
    try:
        job.join()
    except KeyboardInterrupt:
        stopped.append(1)
        job.kill()
    if stopped:
        print("interrupted; stopped every process this benchmark started", file=sys.stderr)
        return 130
    return int(job.get())


if __name__ == "__main__":
    sys.exit(main())
