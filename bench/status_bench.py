"""Benchmark of the fleet summary and ``llmgw ctl status``'s rendering.

    .venv/bin/python bench/status_bench.py [--sizes 4,500,2000]

For fleets of N nodes x 8 GPUs in 4 fabrics (every 10th node split into MIG instances, 1%
silent, a few unhealthy cards), with N/2 models and about two replicas each
(tests/status/builders.big_fleet): the time of each step an operator waits for between
the rows being read and the screen being drawn, best of 5:

- summary: ``status.summary.build`` (the control service, once per request);
- wire: the summary through JSON and back (what travels to ``ctl``);
- render: ``status.render.render`` at 120 columns.

Target: the three together under 1 s at 2,000 nodes. Exit status 1 when it is missed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw_runtime.status import summary  # noqa: E402
from llmgw_runtime.status.render import render  # noqa: E402
from tests.status.builders import NOW, big_fleet  # noqa: E402

TARGET_S = 1.0


def best(fn: Callable[[], Any], runs: int = 5) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(runs):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,500,2000")
    args = parser.parse_args()
    print("status: summary + JSON + render, best of 5 (ms)")
    print(f"{'nodes':>6} {'models':>6} {'replicas':>8} {'summary':>8} {'wire':>6} "
          f"{'render':>7} {'total':>7} {'lines':>6}  target")
    ok = True
    for n in (int(x) for x in args.sizes.split(",")):
        models, nodes, replicas = big_fleet(n, max(4, n // 2))
        t_sum, s = best(partial(summary.build, models, nodes, replicas, NOW))
        t_wire, wire = best(partial(json.loads, json.dumps(s)))
        t_render, text = best(partial(render, wire, 120))
        total = t_sum + t_wire + t_render
        verdict = ""
        if n >= 2000:
            verdict = f"< {TARGET_S * 1000:.0f} ms " + ("PASS" if total < TARGET_S else "MISS")
            ok = ok and total < TARGET_S
        print(f"{n:>6} {len(models):>6} {len(replicas):>8} {t_sum * 1000:>8.1f} "
              f"{t_wire * 1000:>6.1f} {t_render * 1000:>7.1f} {total * 1000:>7.1f} "
              f"{len(str(text).splitlines()):>6}  {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
