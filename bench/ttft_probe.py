"""Time to first token through the router against the engine directly (streamed chat).

A small, bounded, loopback-only load tool for one question: how much later does a
streamed chat completion's first *content* token arrive through the router than straight
from the engine, and where does the difference come from. It sends GuideLLM-like requests
(a prompt of about ``--prompt-tokens`` tokens, ``--max-tokens`` answer tokens, streamed)
from ``--concurrency`` closed-loop clients and alternates the targets round by round
(direct, router, direct, router...), so a busy machine hurts both alike.

Per request it records, on the client's clock:

- ``byte``: the answer's first byte (status line) after the request was sent;
- ``event``: the first SSE event (llama.cpp's first event is a role-only delta);
- ``ttft``: the first event whose delta has non-empty ``content`` (what GuideLLM calls
  time to first token);
- ``itl``: the mean gap between later content tokens;
- from the engine's ``timings`` (on the finishing chunk; the router passes it on):
  ``prompt_ms`` (prefill), ``prompt_n`` and ``cache_n`` (tokens the prompt cache served);
- ``handoff``: a queued request's first content token after the previous stream ended
  (on the client), minus the engine's ``prompt_ms``: the time the hand-off and the path
  add, whatever the queue.

Run (the engine's port from ``llmgw ctl replicas -o json``)::

    .venv/bin/python bench/ttft_probe.py --target direct=http://127.0.0.1:ENGINE_PORT \\
        --target router=http://127.0.0.1:18480 --concurrency 1,2,4 --requests 12 --rounds 2

``--mode same`` sends one prompt every time (the engine's prompt cache serves it);
``--new-connection`` opens a connection per request instead of keeping one per client;
``--json FILE`` writes every request's record. Everything is bounded: at most
``--requests`` per target, concurrency and round, each with ``--timeout`` seconds.

Reading it: at concurrency 2 and more with a one-slot engine a request's TTFT holds the
service of the requests ahead of it, so anything that slows the engine's compute (CPU the
router takes on a 2-core machine) shows in TTFT and ITL while ``byte``/``handoff`` stay
flat; compare ``prompt_ms`` and ITL too. On a shared machine one round's medians move by
hundreds of milliseconds: use several rounds and compare round by round.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

WORDS = ("time year people way day man thing woman life child world school state family "
         "student group country problem hand part place case week company system program "
         "question work government number night point home water room mother area money "
         "story fact month lot right study book eye job word business issue side kind head "
         "house service friend father power hour game line end member law car city "
         "community name president team minute idea kid body information back parent face "
         "others level office door health person art war history party result change "
         "morning reason research girl guy moment air teacher force education").split()


def prompt_text(n_tokens: int, seed: int | None) -> str:
    """About ``n_tokens`` tokens of words (SmolLM2's tokenizer: a common word with its
    space is one token); ``seed`` None: the same text every time. A unique request's
    number comes first, so no prefix of it is in the engine's prompt cache."""
    rng = random.Random(0 if seed is None else seed)
    words = [rng.choice(WORDS) for _ in range(max(1, n_tokens - 24))]
    head = "Summarise this." if seed is None else f"Request {seed}: summarise this."
    return head + " " + " ".join(words)


class Conn:
    """One keep-alive HTTP/1.1 connection, read by hand (chunked or length framing)."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self.sock: socket.socket | None = None
        self.buf = b""

    def open(self) -> None:
        self.close()
        self.sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        self.buf = b""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _more(self) -> None:
        assert self.sock is not None
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the server")
        self.buf += data

    def _until(self, sep: bytes) -> bytes:
        while True:
            i = self.buf.find(sep)
            if i >= 0:
                out, self.buf = self.buf[:i], self.buf[i + len(sep):]
                return out
            self._more()

    def _exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._more()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def stream(self, path: str, body: bytes, rec: dict[str, Any]) -> None:
        """POST ``body`` and read the streamed answer, noting times in ``rec``."""
        if self.sock is None:
            self.open()
        assert self.sock is not None
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        t0 = time.perf_counter()
        rec["t_send"] = t0
        self.sock.sendall(head + body)
        while not self.buf:
            self._more()
        rec["byte"] = time.perf_counter() - t0
        status_and_head = self._until(b"\r\n\r\n").decode("latin-1")
        status = int(status_and_head.split(" ", 2)[1])
        rec["status"] = status
        fields = {k.strip().lower(): v.strip() for k, _, v in
                  (line.partition(":") for line in status_and_head.split("\r\n")[1:])}
        chunked = "chunked" in fields.get("transfer-encoding", "").lower()
        length = int(fields.get("content-length", "-1"))
        keep = "close" not in fields.get("connection", "").lower()
        sse = b""
        content_times: list[float] = []

        def take(data: bytes) -> None:
            nonlocal sse
            sse += data
            while True:
                i = sse.find(b"\n\n")
                if i < 0:
                    return
                event, sse = sse[:i], sse[i + 2:]
                now = time.perf_counter()
                rec.setdefault("event", now - t0)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    text = line[5:].strip()
                    if text == b"[DONE]":
                        continue
                    try:
                        doc = json.loads(text)
                    except ValueError:
                        continue
                    if "timings" in doc:
                        rec["timings"] = doc["timings"]
                    for choice in doc.get("choices") or ():
                        if (choice.get("delta") or {}).get("content"):
                            content_times.append(now)
                            rec.setdefault("ttft", now - t0)

        if chunked:
            while True:
                size = int(self._until(b"\r\n").split(b";")[0], 16)
                if size == 0:
                    self._until(b"\r\n")
                    break
                take(self._exactly(size))
                self._exactly(2)
        elif length >= 0:
            take(self._exactly(length))
        else:
            keep = False
            try:
                while True:
                    take(self.buf)
                    self.buf = b""
                    self._more()
            except ConnectionError:
                pass
        rec["t_end"] = time.perf_counter()
        rec["tokens"] = len(content_times)
        if len(content_times) > 1:
            rec["itl"] = (content_times[-1] - content_times[0]) / (len(content_times) - 1)
        if not keep:
            self.close()


def run_level(url: str, model: str, concurrency: int, n: int, args: argparse.Namespace,
              seeds: Any) -> list[dict[str, Any]]:
    """``n`` requests from ``concurrency`` closed-loop clients; their records."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    base = parts.path.rstrip("/")
    path = (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"
    records: list[dict[str, Any]] = []
    lock = threading.Lock()
    left = [n]

    def client() -> None:
        conn = Conn(host, port, args.timeout)
        try:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                    seed = next(seeds)
                doc = {"model": model, "stream": True, "max_tokens": args.max_tokens,
                       "messages": [{"role": "user", "content": prompt_text(
                           args.prompt_tokens, None if args.mode == "same" else seed)}]}
                if args.ignore_eos:
                    doc["ignore_eos"] = True
                if args.include_usage:
                    doc["stream_options"] = {"include_usage": True}
                rec: dict[str, Any] = {"concurrency": concurrency}
                body = json.dumps(doc).encode()
                try:
                    if args.new_connection:
                        conn.open()
                    reused = conn.sock is not None
                    try:
                        conn.stream(path, body, rec)
                    except (ConnectionError, OSError):
                        # a kept-alive connection the server closed (llama.cpp closes
                        # one after a stream): sent once more on a new one, as HTTP
                        # clients do, when no byte of the answer came
                        if not reused or "byte" in rec:
                            raise
                        conn.open()
                        rec.clear()
                        rec["concurrency"] = concurrency
                        rec["resent"] = True
                        conn.stream(path, body, rec)
                except (OSError, ValueError, ConnectionError) as exc:
                    rec["error"] = f"{type(exc).__name__}: {exc}"
                    conn.close()
                with lock:
                    records.append(rec)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # hand-off: after the latest other stream that ended before this one's first token
    ends = sorted(r["t_end"] for r in records if "t_end" in r)
    for r in records:
        if "ttft" not in r:
            continue
        first = r["t_send"] + r["ttft"]
        before = [e for e in ends if r["t_send"] < e < first]
        if before and "timings" in r:
            r["handoff"] = first - before[-1] - r["timings"].get("prompt_ms", 0) / 1000
    return records


def summary(values: list[float]) -> str:
    if not values:
        return "        -          -"
    values = sorted(values)
    p90 = values[min(len(values) - 1, int(0.9 * len(values) + 0.5) - 1)]
    return f"{statistics.median(values) * 1000:9.1f} {p90 * 1000:9.1f}"


def report(records: list[dict[str, Any]], targets: list[str], levels: list[int]) -> None:
    cols = [("byte", "byte"), ("event", "1st event"), ("ttft", "TTFT"),
            ("prompt_ms", "prompt_ms"), ("handoff", "handoff-pf"), ("itl", "ITL")]
    print(f"{'target':>8} {'c':>2} {'n':>4} {'err':>3} " + " ".join(
        f"{name + ' p50':>9} {'p90':>9}" for _, name in cols) + "   cache_n p50")
    for c in levels:
        for t in targets:
            rs = [r for r in records if r["target"] == t and r["concurrency"] == c]
            ok = [r for r in rs if "error" not in r]
            row = f"{t:>8} {c:>2} {len(rs):>4} {len(rs) - len(ok):>3} "
            for key, _ in cols:
                if key == "prompt_ms":
                    vals = [r["timings"]["prompt_ms"] / 1000 for r in ok if "timings" in r]
                else:
                    vals = [r[key] for r in ok if key in r]
                row += summary(vals) + " "
            cache = [r["timings"].get("cache_n", 0) for r in ok if "timings" in r]
            row += f"  {statistics.median(cache) if cache else '-'}"
            print(row)
    a = targets[0]
    for b in targets[1:]:
        print(f"median TTFT {b} - {a} per concurrency (ms):", ", ".join(
            f"c={c}: " + _diff(records, a, b, c) for c in levels))
    errors = [r["error"] for r in records if "error" in r]
    if errors:
        print(f"{len(errors)} errors, e.g. {errors[0]}")


def _diff(records: list[dict[str, Any]], a: str, b: str, c: int) -> str:
    va = [r["ttft"] for r in records if r["target"] == a and r["concurrency"] == c
          and "ttft" in r]
    vb = [r["ttft"] for r in records if r["target"] == b and r["concurrency"] == c
          and "ttft" in r]
    if not va or not vb:
        return "-"
    return f"{(statistics.median(vb) - statistics.median(va)) * 1000:+.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", action="append", required=True,
                    help="NAME=URL (the engine's or the router's base URL); repeat")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--concurrency", default="1,2,4", help="comma-separated levels")
    ap.add_argument("--requests", type=int, default=12,
                    help="requests per target, level and round (at most 200)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations (at most 10)")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--mode", choices=("unique", "same"), default="unique")
    ap.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--include-usage", action="store_true",
                    help="the client asks for usage itself (GuideLLM does)")
    ap.add_argument("--new-connection", action="store_true")
    ap.add_argument("--warmup", type=int, default=2, help="requests per target first")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", help="write every request's record here")
    args = ap.parse_args(argv)
    targets = [t.split("=", 1) for t in args.target]
    for t in targets:
        host = urlsplit(t[1]).hostname
        if len(t) != 2 or host not in ("127.0.0.1", "localhost", "::1"):
            ap.error(f"--target {t!r}: NAME=URL on loopback")
    levels = [int(c) for c in args.concurrency.split(",")]
    args.requests = min(args.requests, 200)
    args.rounds = min(args.rounds, 10)
    seeds = iter(range(random.randrange(1 << 30), 1 << 62))
    records: list[dict[str, Any]] = []
    for _name, url in targets:
        run_level(url, args.model, 1, args.warmup, args, seeds)
    for rnd in range(args.rounds):
        for c in levels:
            k = rnd % len(targets)           # each round starts with the next target
            order = targets[k:] + targets[:k] if len(targets) > 2 or rnd % 2 == 0 \
                else targets[::-1]
            for name, url in order:
                t0 = time.monotonic()
                rs = run_level(url, args.model, c, args.requests, args, seeds)
                for r in rs:
                    r["target"], r["round"] = name, rnd
                records += rs
                ok = [r["ttft"] for r in rs if "ttft" in r]
                print(f"round {rnd} c={c} {name}: {len(rs)} requests in "
                      f"{time.monotonic() - t0:.1f} s, TTFT p50 "
                      f"{statistics.median(ok) * 1000 if ok else float('nan'):.1f} ms",
                      file=sys.stderr, flush=True)
    report(records, [t[0] for t in targets], levels)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(records, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())
