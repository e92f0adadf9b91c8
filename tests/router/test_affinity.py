"""Prefix keys and consistent hashing with bounded loads (router/admission/affinity.py)."""

from __future__ import annotations

import collections
import hashlib
import math
import os
import random
import subprocess
import sys
from typing import Any

import pytest

from llmgw_runtime.router.admission.affinity import LOAD_FACTOR, PROMPT_CHARS, choose, prefix_key

REPLICAS = [f"replica-{i}" for i in range(5)]


def chat(*turns: str, system: str | None = None, **extra: Any) -> dict[str, Any]:
    """A chat body: ``turns`` alternate user, assistant, user..."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages += [{"role": "user" if i % 2 == 0 else "assistant", "content": text}
                 for i, text in enumerate(turns)]
    return {"model": "m", "messages": messages, **extra}


def keys(n: int, salt: str = "") -> list[bytes]:
    return [hashlib.sha256(f"{salt}{i}".encode()).digest()[:16] for i in range(n)]


# -- prefix_key -------------------------------------------------------------------------

def test_key_is_stable_across_the_turns_of_one_conversation() -> None:
    first = prefix_key(chat("What is a GPU?", system="Be brief."))
    later = prefix_key(chat("What is a GPU?", "A processor.", "And a TPU?", "Another.",
                            "Which is faster?", system="Be brief."))
    assert first is not None and len(first) == 16
    assert first == later


def test_key_differs_between_conversations_and_system_prompts() -> None:
    base = prefix_key(chat("What is a GPU?", system="Be brief."))
    assert prefix_key(chat("What is a CPU?", system="Be brief.")) != base
    assert prefix_key(chat("What is a GPU?", system="Be thorough.")) != base
    assert prefix_key(chat("What is a GPU?")) != base


def test_key_ignores_tools_and_sampling_fields() -> None:
    plain = prefix_key(chat("hi", system="s"))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert prefix_key(chat("hi", system="s", tools=tools, temperature=0.2, stream=True,
                           max_tokens=9)) == plain


def test_few_shot_turns_before_the_first_user_message_are_part_of_the_key() -> None:
    def body(shot: str, later: str) -> dict[str, Any]:
        return {"messages": [{"role": "system", "content": "classify"},
                             {"role": "assistant", "content": shot},
                             {"role": "user", "content": "text"},
                             {"role": "assistant", "content": later}]}
    assert prefix_key(body("label: a", "x")) == prefix_key(body("label: a", "y"))
    assert prefix_key(body("label: a", "x")) != prefix_key(body("label: b", "x"))


@pytest.mark.parametrize("body", [
    {}, {"model": "m"}, {"model": "m", "input": "embed me"}, {"messages": []},
    {"messages": "hello"}, {"messages": ["hello"]}, {"messages": [3, {"role": "user"}]},
    {"prompt": ""}, {"prompt": []}, {"prompt": [[]]}, {"prompt": {"text": "x"}},
    {"prompt": 7}, {"prompt": [1, "a"]}, {"prompt": [None]},
])
def test_requests_without_a_usable_prefix_have_no_key(body: dict[str, Any]) -> None:
    assert prefix_key(body) is None


def test_completion_key_is_the_prompts_leading_characters() -> None:
    head = "x" * PROMPT_CHARS
    assert prefix_key({"prompt": head + "one"}) == prefix_key({"prompt": head + "two"})
    assert prefix_key({"prompt": "short one"}) != prefix_key({"prompt": "short two"})
    assert prefix_key({"prompt": [head + "a", "other"]}) == prefix_key({"prompt": head + "b"})


def test_completion_prompt_as_tokens_is_keyed_by_its_leading_tokens() -> None:
    tokens = list(range(1000))
    assert prefix_key({"prompt": tokens}) == prefix_key({"prompt": tokens + [5, 6]})
    assert prefix_key({"prompt": [tokens]}) == prefix_key({"prompt": tokens})
    assert prefix_key({"prompt": [1, 2, 3]}) != prefix_key({"prompt": [1, 2, 4]})
    assert prefix_key({"prompt": [1, 2, 3]}) != prefix_key({"prompt": "1,2,3"})


def test_a_chat_and_a_prompt_with_the_same_text_have_different_keys() -> None:
    assert prefix_key({"prompt": "hello"}) != prefix_key(chat("hello"))


def test_work_is_bounded_yet_lengths_still_tell_long_prompts_apart() -> None:
    long = "a" * 1_000_000
    changed_far_in = long[:500_000] + "b" + long[500_001:]
    assert prefix_key(chat("q", system=long)) == prefix_key(chat("q", system=changed_far_in))
    assert prefix_key(chat("q", system=long)) != prefix_key(chat("q", system=long + "a"))
    many = {"messages": [{"role": "system", "content": "s"}] * 100_000}
    assert prefix_key(many) is not None     # reads MAX_MESSAGES of them, not 100,000


def test_multimodal_parts_are_keyed_by_text_and_image() -> None:
    def body(text: str, url: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": url}}]}]}
    same = prefix_key(body("describe", "data:image/png;base64,AAAA"))
    assert same == prefix_key(body("describe", "data:image/png;base64,AAAA"))
    assert same != prefix_key(body("describe", "data:image/png;base64,BBBB"))
    assert same != prefix_key(body("explain", "data:image/png;base64,AAAA"))


def test_lone_surrogates_from_json_are_hashed_not_refused() -> None:
    assert prefix_key(chat("bad \ud800 text")) != prefix_key(chat("bad \ud801 text"))
    assert prefix_key({"prompt": "\udfff"}) is not None


def test_keys_and_choices_are_pinned_so_routers_of_two_versions_agree() -> None:
    """Changing these re-homes every conversation: do it on purpose, never by accident."""
    assert prefix_key(chat("Hello", system="Be brief.")) == bytes.fromhex(
        "e3f6ee63b771dde395f727fd508c7f2a")
    assert prefix_key({"prompt": "def f():"}) == bytes.fromhex(
        "dfb6c336e0d5bf6ab15522ece1e659fc")
    assert [choose(bytes([i]), ["a", "b", "c"], {}) for i in range(8)] == \
        ["a", "b", "c", "c", "a", "c", "b", "c"]


def test_another_process_with_another_hash_seed_chooses_the_same() -> None:
    code = ("from llmgw_runtime.router.admission.affinity import choose, prefix_key\n"
            "k = prefix_key({'messages': [{'role': 'user', 'content': 'hi'}]})\n"
            "print(k.hex(), choose(k, ['r1', 'r2', 'r3', 'r4'], {}))\n")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    key = prefix_key(chat("hi"))
    assert key is not None
    assert out == [key.hex(), choose(key, ["r1", "r2", "r3", "r4"], {})]


# -- choose -------------------------------------------------------------------------------

@pytest.mark.parametrize("level", [0, 7])
def test_same_key_same_replica_when_loads_are_equal(level: int) -> None:
    load = {r: level for r in REPLICAS}
    for key in keys(200):
        home = choose(key, REPLICAS, load)
        assert choose(key, REPLICAS, load) == home
        assert choose(key, list(reversed(REPLICAS)), load) == home   # the set, not its order


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_many_keys_spread_evenly(n: int) -> None:
    replicas = [f"r{i}" for i in range(n)]
    counts = collections.Counter(choose(k, replicas, {}) for k in keys(20_000))
    mean = 20_000 / n
    assert set(counts) == set(replicas)
    assert max(counts.values()) <= 1.2 * mean and min(counts.values()) >= 0.8 * mean


def test_a_hot_key_overflows_once_its_home_is_above_its_share() -> None:
    key = keys(1)[0]
    home = choose(key, REPLICAS, {})
    busy = {r: 4 for r in REPLICAS}
    # n = 5, c = 1.25: the home keeps the key while load + 1 <= ceil(1.25 * (total + 1) / 5)
    assert choose(key, REPLICAS, {**busy, home: 5}) == home   # total 21: share ceil(5.5) = 6
    spilled = choose(key, REPLICAS, {**busy, home: 6})        # total 22: share ceil(5.75) = 6
    assert spilled != home
    assert spilled == choose(key, [r for r in REPLICAS if r != home], {})   # next on the ring
    # at low load the bound is tight: with the others idle, a second request already moves
    assert choose(key, REPLICAS, {home: 1}) != home            # share ceil(1.25 * 2 / 5) = 1


def test_loads_stay_bounded_under_a_skewed_stream() -> None:
    """Mirrokni et al.'s guarantee: after m requests no replica holds more than
    ceil(c * m / n), however skewed the keys."""
    rng = random.Random(7)
    hot, cold = keys(3, "hot"), keys(500, "cold")
    load = {r: 0 for r in REPLICAS}
    for m in range(1, 2001):
        key = rng.choice(hot) if rng.random() < 0.8 else rng.choice(cold)
        load[choose(key, REPLICAS, load)] += 1
        assert max(load.values()) <= math.ceil(LOAD_FACTOR * m / len(REPLICAS))


def test_removing_a_replica_moves_only_its_keys() -> None:
    sample = keys(5000)
    before = {k: choose(k, REPLICAS, {}) for k in sample}
    gone = REPLICAS[2]
    after = {k: choose(k, [r for r in REPLICAS if r != gone], {}) for k in sample}
    moved = [k for k in sample if before[k] != after[k]]
    assert moved and all(before[k] == gone for k in moved)
    assert len(moved) == sum(1 for r in before.values() if r == gone)


def test_adding_a_replica_moves_about_one_in_n_plus_one_keys_all_to_it() -> None:
    sample = keys(5000)
    before = {k: choose(k, REPLICAS, {}) for k in sample}
    grown = REPLICAS + ["replica-new"]
    after = {k: choose(k, grown, {}) for k in sample}
    moved = [k for k in sample if before[k] != after[k]]
    assert all(after[k] == "replica-new" for k in moved)
    assert 0.6 / 6 <= len(moved) / len(sample) <= 1.4 / 6


def test_a_full_replica_is_skipped_even_within_its_share() -> None:
    key = keys(1)[0]
    home = choose(key, REPLICAS, {})
    slots = {r: 4 for r in REPLICAS} | {home: 1}
    load = {r: 1 for r in REPLICAS}
    assert choose(key, REPLICAS, load, slots) != home
    assert choose(key, REPLICAS, load, {r: 4 for r in REPLICAS}) == home


def test_when_every_replica_is_full_the_least_over_its_slots_wins() -> None:
    key = keys(1)[0]
    slots = {r: 2 for r in REPLICAS}
    load = {r: 5 for r in REPLICAS} | {"replica-3": 3}
    assert choose(key, REPLICAS, load, slots) == "replica-3"
    equal = {r: 2 for r in REPLICAS}      # all full and equal: the key's home, for its cache
    assert choose(key, REPLICAS, equal, slots) == choose(key, REPLICAS, {})


def test_missing_loads_count_as_zero_and_one_replica_is_always_chosen() -> None:
    assert choose(b"k", ["only"], {"only": 1000}) == "only"
    assert choose(b"k", REPLICAS, {}) == choose(b"k", REPLICAS, {r: 0 for r in REPLICAS})


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one replica"):
        choose(b"k", [], {})
    with pytest.raises(ValueError, match="at least 1"):
        choose(b"k", REPLICAS, {}, c=0.9)
