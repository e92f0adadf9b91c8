"""The clients of ``affinity_bench.py``: a seeded multi-turn chat workload, streamed chat
requests over raw HTTP (time to first token, the serving replica, llama.cpp's prompt-cache
timings), and closed- and open-loop drivers. Plain threads; no process is started here."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

REPLICA_HEADER = "X-Llmgw-Replica"
WORDS_PER_TOKEN = 0.87    # the random English text below, in SmolLM2's tokenizer (measured)
WARM_FRACTION = 0.2       # the first fifth of a throughput run is not counted

WORDS = """time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program question work
government number night point home water room mother area money story fact month lot right
study book eye job word business issue side kind head house service friend father power hour
game line end member law car city community name president team minute idea kid body
information back parent face others level office door health person art war history party
result change morning reason research girl guy moment air teacher force education river
garden bridge window market letter village mountain island forest engine signal harbor
valley castle kitchen station library museum painter farmer doctor sailor merchant soldier
blue green quiet ancient bright narrow heavy gentle rapid distant careful golden silver
builds carries follows measures watches repairs remembers explains collects travels
opens closes paints sells grows writes reads finds keeps moves""".split()


# -- the workload: deterministic text from a seed ------------------------------------------

def sentence(rng: random.Random, words: int) -> str:
    text = " ".join(rng.choice(WORDS) for _ in range(words))
    return text[0].upper() + text[1:] + "."


def system_prompt(rng: random.Random, index: int, tokens: int) -> str:
    head = (f"You are assistant number {index} of the {rng.choice(WORDS)} "
            f"{rng.choice(WORDS)} office. Answer briefly, using the notes below.\nNotes:\n")
    parts = [head]
    words = int(tokens * WORDS_PER_TOKEN)
    while words > 0:
        n = rng.randint(8, 16)
        parts.append(sentence(rng, n) + (" " if rng.random() < 0.8 else "\n"))
        words -= n
    return "".join(parts)


@dataclass
class Conversation:
    index: int
    system: str
    questions: list[str]
    think_s: list[float]           # the pause before each turn after the first
    history: list[dict[str, str]] = field(default_factory=list)
    turn: int = 0
    busy: bool = False
    ready_at: float = 0.0
    last_replica: str | None = None


def conversations(seed: int, count: int, turns: int, system_tokens: int,
                  think_mean_s: float) -> list[Conversation]:
    out = []
    for i in range(count):
        rng = random.Random(f"{seed}/{i}")
        system = system_prompt(rng, i, system_tokens)
        questions = [f"Question {t + 1}: what does the note about the {rng.choice(WORDS)} "
                     f"{rng.choice(WORDS)} say? {sentence(rng, rng.randint(6, 12))}"
                     for t in range(turns)]
        think = [rng.expovariate(1 / think_mean_s) if think_mean_s > 0 else 0.0
                 for _ in range(turns)]
        out.append(Conversation(i, system, questions, think,
                                [{"role": "system", "content": system}]))
    return out


# -- one streaming request ----------------------------------------------------------------

@dataclass
class Answer:
    status: int
    ttft_s: float | None = None      # to the first content chunk
    total_s: float = 0.0
    text: str = ""
    replica: str | None = None
    retry_after: str | None = None
    error: str | None = None         # a transport error, a non-200 non-429 or a bad stream
    code: str | None = None          # the OpenAI error code of a non-200 answer
    prompt_n: int | None = None      # llama.cpp's timings: tokens prefilled
    cache_n: int | None = None       # and tokens reused from its prompt cache
    started: float = 0.0
    finished: float = 0.0


@dataclass(frozen=True)
class Client:
    """Where requests go: the router on 127.0.0.1:``port``, with an API key and a model."""

    port: int
    key: str
    model: str

    def chat(self, body: dict[str, Any], timeout_s: float) -> Answer:
        """One streamed chat completion of ``body`` (``model`` and ``stream`` set here)."""
        return stream_chat(self, body, timeout_s)


def stream_chat(client: Client, body: dict[str, Any], timeout_s: float) -> Answer:
    payload = json.dumps({**body, "model": client.model, "stream": True}).encode()
    t0 = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=timeout_s)
    ans = Answer(status=0, started=t0)
    try:
        conn.request("POST", "/v1/chat/completions", payload,
                     {"Authorization": f"Bearer {client.key}",
                      "Content-Type": "application/json"})
        resp = conn.getresponse()
        ans.status = resp.status
        ans.replica = resp.getheader(REPLICA_HEADER)
        ans.retry_after = resp.getheader("Retry-After")
        if resp.status != 200:
            detail = resp.read(4000).decode("utf-8", "replace")
            try:
                ans.code = str(json.loads(detail)["error"]["code"])
            except (ValueError, KeyError, TypeError):
                pass
            if resp.status != 429:
                ans.error = f"HTTP {resp.status}: {detail[:200]}"
            return ans
        parts: list[str] = []
        done = False
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            for choice in chunk.get("choices") or ():
                content = (choice.get("delta") or {}).get("content")
                if content:
                    if ans.ttft_s is None:
                        ans.ttft_s = time.monotonic() - t0
                    parts.append(content)
            timings = chunk.get("timings")
            if timings:
                ans.prompt_n = timings.get("prompt_n")
                ans.cache_n = timings.get("cache_n")
        ans.text = "".join(parts)
        if not done:
            ans.error = "the stream ended without data: [DONE]"
        elif ans.ttft_s is None:
            ans.ttft_s = time.monotonic() - t0   # an empty answer: first token = the end
    except (OSError, http.client.HTTPException, ValueError) as exc:
        ans.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
        ans.finished = time.monotonic()
        ans.total_s = ans.finished - t0
    return ans


# -- the multi-turn chat workload ----------------------------------------------------------

@dataclass
class Turn:
    conversation: int
    turn: int
    answer: Answer
    previous_replica: str | None


def run_chat(client: Client, convs: list[Conversation], concurrency: int, seed: int,
             max_tokens: int) -> tuple[list[Turn], float]:
    """Workers take a random conversation whose previous answer came back and whose user
    returned (its think time passed) and send its next turn, until every turn is done."""
    lock = threading.Condition()
    pick = random.Random(f"{seed}/pick")
    turns: list[Turn] = []

    def next_conversation() -> Conversation | None:
        with lock:
            while True:
                left = [c for c in convs if c.turn < len(c.questions)]
                if not left:
                    return None
                now = time.monotonic()
                ready = [c for c in left if not c.busy and c.ready_at <= now]
                if ready:
                    conv = pick.choice(ready)
                    conv.busy = True
                    return conv
                waits = [c.ready_at - now for c in left if not c.busy]
                lock.wait(min(waits) if waits else None)

    def worker() -> None:
        while (conv := next_conversation()) is not None:
            conv.history.append({"role": "user", "content": conv.questions[conv.turn]})
            ans = client.chat({"messages": conv.history, "max_tokens": max_tokens,
                               "temperature": 0}, timeout_s=600)
            with lock:
                turns.append(Turn(conv.index, conv.turn, ans, conv.last_replica))
                conv.history.append({"role": "assistant", "content": ans.text or "(none)"})
                conv.last_replica = ans.replica
                conv.turn += 1
                if ans.error:
                    conv.turn = len(conv.questions)   # no answer to build on: end it
                elif conv.turn < len(conv.questions):
                    conv.ready_at = time.monotonic() + conv.think_s[conv.turn]
                conv.busy = False
                lock.notify_all()

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return turns, time.monotonic() - t0


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


# -- closed and open loops of short prompts ----------------------------------------------

def short_prompt(rng: random.Random) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": sentence(rng, rng.randint(20, 30))
                          + " Say something about it."}], "temperature": 0}


def rate_in_window(answers: list[Answer], t0: float, duration_s: float) -> float:
    """Completions per second in the steady part of a run: those finished after its first
    fifth (the queue filling, the slots starting) and before its end."""
    start = t0 + WARM_FRACTION * duration_s
    end = t0 + duration_s
    done = [a for a in answers if a.status == 200 and not a.error and start <= a.finished <= end]
    return len(done) / (end - start)


def closed_loop(client: Client, concurrency: int, duration_s: float, min_done: int,
                rng: random.Random, max_tokens: int) -> tuple[list[Answer], float]:
    """``concurrency`` clients, each sending its next request when its last one is
    answered, for ``duration_s`` and until ``min_done`` were answered (at most 3x as long).
    Returns the answers and the completion rate after the first ``concurrency`` answers
    (the first wave starts together; its end is where the steady state begins)."""
    lock = threading.Lock()
    answers: list[Answer] = []
    t0 = time.monotonic()

    def more() -> bool:
        elapsed = time.monotonic() - t0
        with lock:
            done = sum(a.status == 200 and not a.error for a in answers)
        return elapsed < duration_s or (done < min_done and elapsed < 3 * duration_s)

    def worker() -> None:
        while more():
            with lock:
                body = short_prompt(rng)
            ans = client.chat({**body, "max_tokens": max_tokens}, timeout_s=120)
            with lock:
                answers.append(ans)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ends = sorted(a.finished for a in answers if a.status == 200 and not a.error)
    if len(ends) <= concurrency + 1:
        return answers, float("nan")
    return answers, (len(ends) - concurrency) / (ends[-1] - ends[concurrency - 1])


def open_loop(client: Client, rate: float, duration_s: float, rng: random.Random,
              max_tokens: int, drain_s: float, cap: int, at_end: Callable[[], Any] = lambda: None
              ) -> tuple[list[Answer], int, float]:
    """Poisson arrivals at ``rate``/s for ``duration_s``, one thread each (at most ``cap``
    in flight: arrivals beyond it are counted as skipped); ``at_end`` runs when the
    arrivals end, before waiting up to ``drain_s`` for what is still in flight."""
    lock = threading.Lock()
    answers: list[Answer] = []
    in_flight = [0]
    skipped = 0

    def one(body: dict[str, Any]) -> None:
        ans = client.chat({**body, "max_tokens": max_tokens}, timeout_s=drain_s + 60)
        with lock:
            answers.append(ans)
            in_flight[0] -= 1

    threads = []
    t0 = time.monotonic()
    at = t0
    while True:
        at += rng.expovariate(rate)
        if at >= t0 + duration_s:
            break
        time.sleep(max(0.0, at - time.monotonic()))
        with lock:
            if in_flight[0] >= cap:
                skipped += 1
                continue
            in_flight[0] += 1
        t = threading.Thread(target=one, args=(short_prompt(rng),), daemon=True)
        t.start()
        threads.append(t)
    at_end()
    deadline = time.monotonic() + drain_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    with lock:
        unfinished = in_flight[0]
    return list(answers), skipped + unfinished, t0


