"""Benchmark of the control plane under agent load, against a real PostgreSQL.

    .venv/bin/python bench/control_bench.py [--quick] [--controls 2] [--reports full]

Starts PostgreSQL (tests/support/postgres.py), one or two real control services (`llmgw
server`, each with its web workers and its reconciler process, all on the one database)
and the simulated agents in a process of their own (bench/agent_sim.py, its own process
group: its CPU is counted apart). Every agent joins first; 250 of them report while a
catalog of 1,000 models x 2 one-GPU replicas is applied and placed (the agents then report
those replicas ready). Then the scenarios of issue 30, growing the reporting fleet:

- the curve: 1,000, 2,000, 5,000 and 10,000 agents at the default report interval (its
  10,000 row is scenario b: steady, report p99 < 100 ms, control + PostgreSQL CPU per report
  <= 0.5 ms). A fleet size whose rate does not hold is measured again at 85 % of the rate
  it achieved (at 10,000 up to --retries times), so every size has a rate that held;
- a: 2,000 agents at 400 reports/s (every 5 s): report p99 < 50 ms;
- c: the largest fleet at the interval that held, 5 % of its nodes changing per minute (an
  engine restart or new device readings) and a catalog apply every 30 s: report p99 < 150
  ms, reconcile pass p99 < 300 ms.

Per step: target and achieved reports/s, p50/p95/p99/max latency from the scheduled send
time, errors, what was sent (full reports, heartbeats, heartbeats answered "send the full
report"), per-host rates, the CPU of each control service (its reconciler included),
PostgreSQL, the simulator, this process and the rest of the machine, CPU ms per report, and
the reconciler's pass durations from its log line. Stops every process it started (also on
Ctrl-C and SIGTERM). Exits 0; 1 with --strict when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT))

from harness import (  # noqa: E402
    Control,
    Cpu,
    DbStats,
    Sim,
    catalog_json,
    leaders,
    pass_stats,
)

from llmgw_runtime.control.config import ControlConfig  # noqa: E402
from tests.support.postgres import PostgresServer  # noqa: E402

DEFAULT = ControlConfig()
INTERVAL = DEFAULT.report_interval_s
CHURN_PER_MIN = 0.05
APPLY_EVERY_S = 30.0
SETTLED_COMMITS = 100       # commits/s: a steady fleet's are batches (20-40/s at any size)
SETTLE_MAX_S = 90.0
TARGETS = {  # scenario -> (report p99 ms, CPU ms per report control+postgres, pass p99 ms)
    "a": (50.0, None, None),
    "b": (100.0, 0.5, None),
    "c": (150.0, None, 300.0),
}


class Bench:
    def __init__(self, args: argparse.Namespace, pg: PostgresServer, workdir: Path) -> None:
        self.args, self.pg, self.workdir = args, pg, workdir
        url = pg.create_database("bench")
        self.controls: list[Control] = []
        for i in range(args.controls):   # one after the other: each migrates at start
            self.controls.append(Control(url, workdir / f"control-{i}", f"host-{'ab'[i]}",
                                         self.controls[0] if self.controls else None,
                                         args.workers, max(args.sizes) + 500))
        self.sim = Sim([c.port for c in self.controls], self.controls[0].join_token,
                       args.reports, args.shared_weights, workdir / "sim.log")
        pg_pid = int((pg.data / "postmaster.pid").read_text().split()[0])
        self.cpu = Cpu({**{c.name: c.proc.pid for c in self.controls}, "postgres": pg_pid,
                        "sim": self.sim.proc.pid})
        self.db = DbStats(url)
        self.rows: list[dict[str, Any]] = []
        self.catalog_more = False

    def stop(self) -> None:
        self.db.close()
        self.sim.stop()
        for c in self.controls:
            c.stop()

    # ------------------------------------------------------------ the steps

    def apply(self, more: bool) -> tuple[float, int]:
        """PUT the catalog (through the first host); returns its seconds and HTTP status."""
        started = time.perf_counter()
        status, body = self.controls[0].call(
            "PUT", "/api/v1/catalog", catalog_json(self.args.models, 2, more),
            content_type="application/yaml")
        took = time.perf_counter() - started
        if status == 200:
            self.catalog_more = more
        else:
            print(f"applying the catalog: HTTP {status} after {took:.1f} s {body[:200]!r}",
                  flush=True)
        return took, status

    def place(self) -> None:
        first = max(min(self.args.sizes[0], 250), -(-self.args.models * 2 // 8))
        took = self.sim.call("join", total=first)["took_s"]
        print(f"{first} agents joined in {took:.1f} s (the others join as the fleet grows)",
              flush=True)
        self.sim.call("grow", total=first, rate=self.args.grow_rate)
        time.sleep(self.sim.period + 1)               # every node has reported its devices
        for _ in range(3):                            # a 503 says when to retry
            if self.apply(False)[1] == 200:
                break
            time.sleep(5)
        else:
            raise RuntimeError("the catalog could not be applied")
        took = self.controls[0].wait_placed(self.args.models * 2, 300)
        print(f"{self.args.models} models, {self.args.models * 2} replicas placed and ready "
              f"in {took:.0f} s", flush=True)

    def step(self, scenario: str, agents: int, period: float, window_s: float,
             churn: bool = False) -> dict[str, Any]:
        if period != self.sim.period:
            self.sim.call("period", seconds=period)
            self.sim.period = period
        spread = self.sim.call("grow", total=agents, rate=self.args.grow_rate)["spread_s"]
        # Settle: the new agents' first reports (full ones, with a transaction each: two
        # per agent, the second once the catalog's sources came) and the backlog of a step
        # that saturated pass; the steady fleet is what is measured.
        time.sleep(spread + max(self.args.settle, 2 * period))
        self.settle(SETTLE_MAX_S)

        applies: list[tuple[float, int, float]] = []
        stop_applying = threading.Event()
        if churn:
            self.sim.call("churn", per_min=CHURN_PER_MIN)
            applier = threading.Thread(target=self._applies, args=(applies, stop_applying),
                                       daemon=True)
            time.sleep(period * 2)                    # the first changes have been reported
        marks = [c.log_size() for c in self.controls]
        before, db0, start = self.cpu.sample(), self.db.sample(), time.perf_counter()
        wall = time.time()      # when each second of the timeline was (a minute's start)
        if churn:
            applier.start()
        print(f"{scenario}: measuring {window_s:.0f} s from now", flush=True)
        time.sleep(window_s)
        end = time.perf_counter()
        after, db1 = self.cpu.sample(), self.db.sample()
        stop_applying.set()
        if churn:
            self.sim.call("churn", per_min=0)
            applier.join()
        time.sleep(2.0)                               # the window's last answers arrive
        w = self.sim.call("window", start=start, end=end)
        cpu = self.cpu.percent(before, after, end - start)
        passes = pass_stats([c.log_since(m) for c, m in zip(self.controls, marks,
                                                             strict=True)])
        row = {"scenario": scenario, "agents": agents, "period_s": period,
               "target_rate": agents / period, "window_s": window_s, "churn": churn,
               "applies_s": [(s, code, at - start) for s, code, at in applies],
               "cpu": cpu, "passes": passes,
               "db_per_s": {k: (db1[k] - db0[k]) / (end - start) for k in db0}, **w}
        web = sum(cpu[c.name] for c in self.controls)
        rec = sum(cpu[c.name + "/reconciler"] for c in self.controls)
        row["control_cpu_ms"] = (web + rec) * 10 / w["rate"] if w["rate"] else math.nan
        row["web_cpu_ms"] = web * 10 / w["rate"] if w["rate"] else math.nan
        row["postgres_cpu_ms"] = cpu["postgres"] * 10 / w["rate"] if w["rate"] else math.nan
        row["held"] = w["rate"] >= 0.95 * row["target_rate"] and not w["late"]
        self.rows.append(row)
        print(line(row, self.controls), flush=True)
        print(f"{'':>5} each second's p99 ms (answered; * a second in which a minute began: "
              "the reconciler's history sample): "
              + " ".join(f"{p99:.0f}{'*' if minute_began(wall + i) else ''}"
                         for i, (_, p99, _) in enumerate(w["timeline"])), flush=True)
        return row

    def settle(self, most_s: float) -> None:
        """Wait (up to ``most_s``) until PostgreSQL's commits fall under SETTLED_COMMITS a
        second: a steady fleet's heartbeats commit in batches, full reports one each."""
        deadline = time.monotonic() + most_s
        while time.monotonic() < deadline:
            before = self.db.sample()["xact_commit"]
            time.sleep(2.0)
            if (self.db.sample()["xact_commit"] - before) / 2.0 < SETTLED_COMMITS:
                return
        print(f"still over {SETTLED_COMMITS} commits/s after settling {most_s:.0f} s more",
              flush=True)

    def _applies(self, took: list[tuple[float, int, float]], stop: threading.Event) -> None:
        """Apply every APPLY_EVERY_S: (seconds, HTTP status, start on perf_counter)."""
        while not stop.is_set():
            at = time.perf_counter()
            took.append((*self.apply(not self.catalog_more), at))
            stop.wait(APPLY_EVERY_S)

    def run(self) -> None:
        a = self.args
        self.sim.call("init", period=INTERVAL if a.sizes[0] >= 1000 else 5.0)
        self.sim.period = INTERVAL if a.sizes[0] >= 1000 else 5.0
        self.place()
        capacity: float | None = None     # answers/s of the last step that saturated
        for n in a.sizes:
            if n == 2000 and a.scenario_a:
                self.step("a", 2000, 5.0, a.window)
            scenario = "b" if n == max(a.sizes) else "curve"
            period, tries = INTERVAL, 0
            if capacity is not None and n / INTERVAL > 2 * capacity:
                period = round(n / (0.85 * capacity), 1)
                print(f"{n} agents every {INTERVAL:g} s would be {n / INTERVAL:.0f} reports/s, "
                      f"over twice the {capacity:.0f}/s a step answered when it saturated: "
                      f"measured every {period:g} s instead", flush=True)
            row = self.step(scenario, n, period, a.window)
            while not row["held"] and tries < (a.retries if scenario == "b" else
                                               min(1, a.retries)):
                tries += 1
                capacity = max(row["rate"], row["done_rate"])
                period = round(n / (0.85 * capacity) if capacity > 1 else period * 2, 1)
                row = self.step(scenario, n, period, a.window)
            if not row["held"]:
                capacity = max(row["rate"], row["done_rate"])
        last = self.rows[-1]
        period = last["period_s"] if last["held"] else last["period_s"] * 1.5
        self.step("c", last["agents"], a.churn_every or period, a.churn_window, churn=True)
        if len(self.controls) > 1:
            print(f"reconciler leaders (llmgw_leader = 1): {leaders(self.controls)}")
        print("largest tables: " + ", ".join(f"{name} {rows:,} rows {size / 2**20:.1f} MiB"
                                             for name, rows, size in self.db.tables()))


def line(r: dict[str, Any], controls: list[Control]) -> str:
    cpu = r["cpu"]
    ctl = "+".join(f"{cpu[c.name]:.0f} (rec {cpu[c.name + '/reconciler']:.0f})"
                   for c in controls)
    errs = ", ".join(f"{k} x{v}" for k, v in r["errors"].items())
    if r["late"]:
        errs += f"{', ' if errs else ''}{r['late']} unanswered"
    hosts = "/".join(f"{x:.0f}" for x in r["host_rates"]) if len(controls) > 1 else ""
    k, p, db = r["kinds"], r["passes"], r["db_per_s"]
    applies = "  applies " + ", ".join(
        f"{s:.1f} s at +{at:.0f} s" + ("" if code == 200 else f" HTTP {code}")
        for s, code, at in r["applies_s"]) if r["applies_s"] else ""
    passes = (f"{p['p99_ms']:.0f}/{p['max_ms']:.0f} (cpu p50/p99 {p['cpu_p50_ms']:.0f}/"
              f"{p['cpu_p99_ms']:.0f})" if p else "n/a")
    return (f"{r['scenario']:>5} {r['agents']:>6} {r['period_s']:>5.1f} {r['target_rate']:>7.0f} "
            f"{r['rate']:>8.1f}{' (' + hosts + ')' if hosts else ''}"
            f"{'' if r['held'] else ' (answered ' + format(r['done_rate'], '.0f') + '/s)'}"
            f" {r['p50_ms']:>7.1f} "
            f"{r['p95_ms']:>7.1f} {r['p99_ms']:>7.1f} {r['max_ms']:>7.0f}  "
            f"p99 of the sim's lateness / from the send {r['lag_p99_ms']:.0f}/"
            f"{r['sent_p99_ms']:.0f}  "
            f"full/hb/hb+full {k['full']}/{k['heartbeat']}/{k['heartbeat+full']}  "
            f"cpu% ctl {ctl} pg {cpu['postgres']:.0f} sim {cpu['sim']:.0f} "
            f"bench {cpu['bench']:.0f} other {cpu['other']:.0f}  "
            f"ms/report {r['control_cpu_ms']:.2f} (web {r['web_cpu_ms']:.2f})+"
            f"{r['postgres_cpu_ms']:.2f}  "
            f"pass p99/max ms {passes}{applies}  db/s commits {db['xact_commit']:.0f} rows "
            f"+{db['tup_inserted']:.0f} ~{db['tup_updated']:.0f} -{db['tup_deleted']:.0f} "
            f"WAL {db['wal_bytes'] / 2**20:.1f} MiB"
            + (f"  ({errs})" if errs else "")
            + ("" if r["held"] else "  SATURATED"))


HEADER = ("scen. agents every target/s achieved/s  p50 ms  p95 ms  p99 ms  max ms  (per row: "
          "what was sent, CPU % of one core, CPU ms per report control+postgres, pass ms)")


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """One line per scenario of the issue's table; "MISSED" marks a missed target."""
    out = []
    for scen, (p99, cpu_ms, pass_ms) in TARGETS.items():
        mine = [r for r in rows if r["scenario"] == scen]
        if not mine:
            continue
        held = [x for x in mine if x["held"]]
        r = next((x for x in mine if x["period_s"] == INTERVAL or scen == "a"),
                 max(held, key=lambda x: x["target_rate"]) if held else mine[-1])
        ok = r["held"] and r["p99_ms"] < p99 and not r["errors"]
        what = [f"{r['agents']} agents every {r['period_s']:g} s ({r['target_rate']:.0f}/s "
                f"target, {r['rate']:.0f}/s achieved): p99 {r['p99_ms']:.0f} ms (< {p99:.0f})"]
        if scen != "a" and r["period_s"] != INTERVAL:
            ok = False
            what.append(f"the default interval ({INTERVAL:g} s) was not measured: the server "
                        "saturated below half its rate" if r["period_s"] > INTERVAL and
                        not any(x["period_s"] == INTERVAL for x in mine) else
                        f"the default interval ({INTERVAL:g} s) did not hold")
        if cpu_ms is not None:
            spent = r["control_cpu_ms"] + r["postgres_cpu_ms"]
            ok &= spent <= cpu_ms
            what.append(f"CPU {spent:.2f} ms per report (<= {cpu_ms})")
        if pass_ms is not None:
            p = r["passes"]
            ok &= bool(p) and p["p99_ms"] < pass_ms
            what.append(f"pass p99 {p['p99_ms']:.0f} ms (< {pass_ms:.0f})" if p else
                        "pass p99 n/a (no reconciler pass line in the log)")
        if scen == "b" and held and (not r["held"] or r["period_s"] != INTERVAL):
            best = max(held, key=lambda x: x["target_rate"])
            what.append(f"highest rate that held at {best['agents']} agents: "
                        f"{best['target_rate']:.0f}/s (every {best['period_s']:g} s, p99 "
                        f"{best['p99_ms']:.0f} ms)")
        out.append(f"{scen}: {'met' if ok else 'MISSED'}: " + ", ".join(what))
    return out


def machine_speed_ms() -> float:
    """CPU ms of a fixed pure-Python loop, best of 3 (lower is faster): this machine's
    speed varies 2x from run to run, so each run says how fast it was at its start and
    end, and runs are compared with that in mind."""
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        sum(i * i for i in range(3_000_000))
        best = min(best, time.process_time() - started)
    return best * 1000


def bench(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-control-bench-"))
    speed = [machine_speed_ms()]
    pg = PostgresServer()
    b: Bench | None = None
    try:
        pg.start()
        b = Bench(args, pg, workdir)
        print(f"PostgreSQL on 127.0.0.1:{pg.port}; {args.controls} control service(s) "
              f"({args.workers or f'{DEFAULT.workers}x{DEFAULT.threads}'} each); agents send "
              f"{args.reports} reports; default interval {INTERVAL:g} s; logs in {workdir}",
              flush=True)
        print(HEADER, flush=True)
        b.run()
    finally:
        if b is not None:
            b.stop()
        if pg.log.exists():
            shutil.copy(pg.log, workdir / "postgres.log")
        pg.stop()
    speed.append(machine_speed_ms())
    print(f"\nmachine speed: a fixed Python loop took {speed[0]:.0f} ms of CPU at the start, "
          f"{speed[1]:.0f} ms at the end (lower is faster)")
    print(HEADER)
    for r in b.rows:
        print(line(r, b.controls))
    print()
    results = verdicts(b.rows)
    print("\n".join(results))
    if args.json:
        Path(args.json).write_text(json.dumps(
            [{**r, "machine_speed_ms": speed} for r in b.rows], indent=1))
    return 1 if args.strict and any("MISSED" in x for x in results) else 0


def minute_began(at: float) -> bool:
    """Whether a minute of the clock begins within the second from ``at`` (time.time)."""
    return math.ceil(at / 60) * 60 < at + 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a smoke check: 200 models, 1,000 and 2,000 agents, 8 s windows")
    ap.add_argument("--controls", type=int, choices=(1, 2), default=1,
                    help="control services on the one PostgreSQL (agents spread over them)")
    ap.add_argument("--reports", choices=("heartbeat", "full"), default="heartbeat",
                    help="what the simulated agents send between changes")
    ap.add_argument("--sizes", default="", help="fleet sizes of the curve "
                    "[1000,2000,5000,10000; --quick 1000,2000]")
    ap.add_argument("--window", type=float, default=0.0, help="seconds measured per step [15]")
    ap.add_argument("--churn-window", type=float, default=0.0,
                    help="seconds measured in scenario c [65: two applies]")
    ap.add_argument("--churn-every", type=float, default=0.0,
                    help="scenario c's report interval [the largest fleet's that held]")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds between growing the fleet and measuring it (at least two "
                         "intervals; then until PostgreSQL's commits fall under "
                         f"{SETTLED_COMMITS}/s, {SETTLE_MAX_S:.0f} s at most) [10]")
    ap.add_argument("--retries", type=int, default=None,
                    help="longer intervals tried when a rate does not hold [2; --quick 0]")
    ap.add_argument("--grow-rate", type=float, default=250.0,
                    help="new agents a second at most (their first reports are full ones)")
    ap.add_argument("--models", type=int, default=0, help="models, 2 replicas each [1000]")
    ap.add_argument("--workers", default="", help="each server's WORKERSxTHREADS "
                    f"[{DEFAULT.workers}x{DEFAULT.threads}]")
    ap.add_argument("--shared-weights", action="store_true",
                    help="agents see every catalog source on shared storage (NFS)")
    ap.add_argument("--json", default="", help="write every row to this file")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args(argv)
    args.sizes = [int(x) for x in (args.sizes or ("1000,2000" if args.quick else
                                                  "1000,2000,5000,10000")).split(",")]
    args.window = args.window or (8.0 if args.quick else 15.0)
    args.settle = args.settle or 10.0
    args.churn_window = args.churn_window or (20.0 if args.quick else 65.0)
    args.models = args.models or (200 if args.quick else 1000)
    if args.retries is None:
        args.retries = 0 if args.quick else 2
    args.scenario_a = 2000 in args.sizes
    return args


def main() -> int:
    args = parse_args()
    stopping: list[int] = []

    def on_term(signum: int, frame: Any) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    try:
        return bench(args)
    except KeyboardInterrupt:
        print("interrupted; stopped every process this benchmark started", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
