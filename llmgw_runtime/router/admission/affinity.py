"""Prefix-affinity routing: requests that share a prompt prefix go to the same replica.

Pure and per call: no I/O, no clock, no state besides a cache of hash rings. Two parts:

:func:`prefix_key` says what prefix a request's engine would have cached. llama.cpp keeps,
per slot, the tokens of that slot's last prompt and reuses the longest common prefix
(``cache_prompt``; a new request goes to the slot whose cache is most similar); vLLM's
automatic prefix caching reuses any cached block-aligned prefix. Either way a hit needs
the same leading tokens on the *same replica*. What a key should cover:

- *The whole history up to the last user turn* changes at every turn, so each turn of a
  conversation would land on a different replica: no reuse of its history at all.
- *The system prompt alone* is shared by every conversation of an application: they would
  all pile onto one replica (a hot key), and once it overflows, a conversation's later turns
  may land anywhere.
- *Everything up to and including the first user message* (system/developer prompts, any
  few-shot turns, the first question) is what every later turn of one conversation resends
  unchanged, and it differs between conversations. Each conversation sticks to one replica,
  where its growing history is cached; conversations spread evenly; a system prompt shared
  by many conversations is prefilled once per replica and then cached there too. This is
  the key for chat requests. Tools are left out: a client that changes its tool list
  between turns keeps its replica, and co-locating two tool sets costs nothing.

For ``/v1/completions`` the key is the prompt's leading :data:`PROMPT_CHARS` characters (or
:data:`PROMPT_TOKENS` token ids): a prompt that grows by appending keeps its key once it is
that long. Requests with neither (embeddings) have no key and are balanced by load.
The work is bounded: at most :data:`MAX_MESSAGES` messages, :data:`MAX_PARTS` content parts
and :data:`MAX_HASHED_CHARS` characters are read, whatever the body's size; the full length
of each message hashed is part of the key, so long prompts differing after the cap still
differ.

:func:`choose` is consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam,
"Consistent Hashing with Bounded Loads", 2017; as in KubeAI's ``internal/loadbalancer``):
each replica has :data:`VNODES` points on a ring, a key walks clockwise from its point, and
takes the first replica that stays within its share of the load. Hashes are SHA-256 (never
Python's randomised ``hash``; SHA-256 over blake2b because CPUs hash it in hardware: ~6 us
for 8 KiB against ~19 us), so every gunicorn worker and every router host sends one
prefix to the same replica without sharing any state.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

KEY_BYTES = 16            # a key's size (SHA-256, truncated)
PART_CHARS = 4096         # characters of one message hashed
MAX_HASHED_CHARS = 8192   # characters of a chat request hashed in all
MAX_MESSAGES = 32         # messages read looking for the first user message
MAX_PARTS = 16            # content parts read per message
PROMPT_CHARS = 1024       # leading characters of a completion prompt
PROMPT_TOKENS = 256       # leading token ids of a completion prompt given as tokens
VNODES = 128              # points per replica on the ring
LOAD_FACTOR = 1.25        # c: a replica may take up to c times the mean load
_PERSON_CHAT = b"llmgw-chat\0"      # domain separation: a chat and a prompt never collide
_PERSON_PROMPT = b"llmgw-prompt\0"


def prefix_key(body: Mapping[str, Any], path: str | None = None) -> bytes | None:
    """A 16-byte key of the prefix the engine would cache for this request body (a chat or
    completion request, already parsed from JSON), or None when it has no usable prefix
    (no messages or prompt, an empty one, or a shape that is not OpenAI's).

    Anthropic's ``/v1/messages`` puts its system prompt in ``system``, OpenAI's
    ``/v1/responses`` in ``instructions`` with the conversation (or one user text) in
    ``input``: both are keyed as the chat they render to. ``input`` means that only on
    ``path`` ``/v1/responses`` (an embeddings request has one too, and no prefix)."""
    messages = body.get("messages")
    if messages is not None:
        return _chat_key(_with_system(body.get("system"), messages))
    prompt = body.get("prompt")
    if prompt is not None:
        return _prompt_key(prompt)
    given = body.get("input")
    if path == "/v1/responses" and given is not None:
        if isinstance(given, str):
            given = [{"role": "user", "content": given}] if given else None
        return _chat_key(_with_system(body.get("instructions"), given))
    return None


def _with_system(system: Any, messages: Any) -> Any:
    """``messages`` after a system message of ``system`` (a text or text blocks), if any."""
    if system is None or not isinstance(messages, list):
        return messages
    return [{"role": "system", "content": system}, *messages[:MAX_MESSAGES]]


def _chat_key(messages: Any) -> bytes | None:
    if not isinstance(messages, list) or not messages:
        return None
    h = hashlib.sha256(_PERSON_CHAT)
    room = MAX_HASHED_CHARS
    for message in messages[:MAX_MESSAGES]:
        if not isinstance(message, dict):
            return None
        role = message.get("role")
        role = role if isinstance(role, str) else ""
        text, length = _content(message.get("content"), min(PART_CHARS, room))
        room -= len(text)
        h.update(_utf8(f"{role[:64]}\x1f{length}\x1f{text}\x1e"))
        if role == "user":
            break
    return h.digest()[:KEY_BYTES]


def _content(content: Any, limit: int) -> tuple[str, int]:
    """The first ``limit`` characters of a message's content, and its whole length."""
    if isinstance(content, str):
        return content[:limit], len(content)
    if not isinstance(content, list):
        return "", 0
    pieces: list[str] = []
    total = 0
    for part in content[:MAX_PARTS]:
        text = _part_text(part)
        total += len(text) + 1
        if limit > 0:
            pieces.append(text[:limit])
            limit -= min(len(text), limit)
    return "\x1d".join(pieces), total


def _part_text(part: Any) -> str:
    """A content part's text: the text, an image's URL (data URLs included) or audio data."""
    if not isinstance(part, dict):
        return ""
    for field, inner in (("text", None), ("image_url", "url"), ("input_audio", "data")):
        value = part.get(field)
        if inner is not None and isinstance(value, dict):
            value = value.get(inner)
        if isinstance(value, str):
            return value
    return ""


def _prompt_key(prompt: Any) -> bytes | None:
    if isinstance(prompt, list):
        if not prompt:
            return None
        if all(isinstance(t, int) for t in prompt[:PROMPT_TOKENS]):
            prompt = prompt[:PROMPT_TOKENS]     # one prompt as token ids
        else:
            prompt = prompt[0]                  # a batch: its first prompt
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) for t in prompt[:PROMPT_TOKENS]):
            return None
        text = "\x1ftokens:" + ",".join(str(t) for t in prompt[:PROMPT_TOKENS])
    elif isinstance(prompt, str) and prompt:
        text = prompt[:PROMPT_CHARS]
    else:
        return None
    return hashlib.sha256(_PERSON_PROMPT + _utf8(text)).digest()[:KEY_BYTES]


def _utf8(text: str) -> bytes:
    # JSON may carry lone surrogates ("\ud800"): hash them rather than fail
    return text.encode("utf-8", "surrogatepass")


def _point(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


@lru_cache(maxsize=256)
def _ring(replicas: tuple[str, ...]) -> tuple[list[int], list[str]]:
    """The ring of a replica set: sorted points and the replica owning each. Cached by the
    tuple of ids as given (the routes table keeps its order); 10 replicas build in a few ms."""
    points = sorted((_point(_utf8(f"{rid}#{i}")), rid)
                    for rid in set(replicas) for i in range(VNODES))
    return [p for p, _ in points], [rid for _, rid in points]


def choose(key: bytes, replicas: Sequence[str], load: Mapping[str, int],
           slots: Mapping[str, int] | None = None, c: float = LOAD_FACTOR,
           floor: Mapping[str, int] | None = None) -> str:
    """The replica for ``key`` among ``replicas`` (distinct ids; not empty).

    ``load``: outstanding requests per replica (missing means 0). ``slots``: a replica's
    capacity, when known (missing means unlimited). Walking the ring from the key's point,
    the first replica that is not full (load < slots) and stays within its share once it
    takes this request, ``load + 1 <= ceil(c * (total_load + 1) / n)``, is chosen; with equal
    loads a key always gets the same replica. When none qualifies (every replica full), the
    one least over its slots (or least loaded), the earliest in walk order among equals.
    ``c`` >= 1 trades balance (1) against affinity (larger); KubeAI uses 1.25 too.
    ``floor``: per replica, a load it may always take up to, whatever the mean (with a few
    requests per replica, ``ceil(c * mean)`` rounds to "full" at once; admission passes
    twice the replica's slots: one round of requests waiting for it).
    """
    n = len(replicas)
    if n == 0:
        raise ValueError("choose needs at least one replica")
    if c < 1.0:
        raise ValueError(f"the load factor c must be at least 1, not {c}")
    if n == 1:
        return replicas[0]
    total = 0
    for rid in replicas:
        total += load.get(rid, 0)
    share = math.ceil(c * (total + 1) / n)
    points, owners = _ring(tuple(replicas))
    size = len(points)
    start = bisect.bisect_left(points, _point(key))
    walked: list[str] = []
    for step in range(size):
        rid = owners[(start + step) % size]
        if rid in walked:
            continue
        walked.append(rid)
        used = load.get(rid, 0)
        limit = slots.get(rid) if slots is not None else None
        bound = share if floor is None else max(share, floor.get(rid, 0))
        if used < bound and (limit is None or used < limit):
            return rid
        if len(walked) == n:
            break

    def excess(rid: str) -> int:
        limit = slots.get(rid) if slots is not None else None
        return load.get(rid, 0) - (limit or 0)

    return min(walked, key=excess)


def fits(rid: str, replicas: Sequence[str], load: Mapping[str, int],
         c: float = LOAD_FACTOR, floor: Mapping[str, int] | None = None) -> bool:
    """Whether ``rid`` may take one more request and stay within its share, as
    :func:`choose` judges each replica on its walk (a remembered home is judged the same)."""
    total = 0
    for other in replicas:
        total += load.get(other, 0)
    share = math.ceil(c * (total + 1) / max(1, len(replicas)))
    bound = share if floor is None else max(share, floor.get(rid, 0))
    return load.get(rid, 0) < bound


def place(key: bytes, replicas: Sequence[str], load: Mapping[str, int],
          floor: Mapping[str, int] | None = None) -> str:
    """The home of a prefix not yet remembered: its :func:`choose` replica when that is
    among the least loaded (so with even loads every router agrees without sharing
    anything), else the least loaded one (ring order among equals)."""
    hashed = choose(key, replicas, load, floor=floor)
    least = min(load.get(rid, 0) for rid in replicas)
    if load.get(hashed, 0) <= least:
        return hashed
    return choose(key, [rid for rid in replicas if load.get(rid, 0) == least], load)
