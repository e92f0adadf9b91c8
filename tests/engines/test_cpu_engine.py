"""The CPU engine serving for real: llama.cpp's own server from the xllamacpp wheel, the tiny
random GGUF (hidden size 64), the real ``openai`` client. Each test starts and stops one
engine on 127.0.0.1 (~1 s)."""

from __future__ import annotations

import json
import math
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.tiny_gguf import HIDDEN

from .conftest import cpu_engine

pytestmark = pytest.mark.slow


TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}|{% endfor %}"


def call(url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return dict(json.load(resp))


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_an_engine_started_with_embeddings_serves_vectors_of_the_models_size(
        tiny_gguf: Path, tmp_path: Path) -> None:
    with cpu_engine(tiny_gguf, tmp_path / "engine.log", "--embeddings", "--pooling", "mean",
                    "-c", "256", "-t", "1") as url:
        reply = client(url).embeddings.create(model="tiny",
                                              input=["hello world", "the model"])
    vectors = [d.embedding for d in reply.data]
    assert [len(v) for v in vectors] == [HIDDEN, HIDDEN]
    assert all(math.isfinite(x) for v in vectors for x in v)
    assert vectors[0] != vectors[1]


def test_an_embedding_model_without_pooling_is_refused_by_the_engine_in_its_words(
        tiny_gguf: Path, tmp_path: Path) -> None:
    """The tiny model says no pooling type: llama-server's rule, kept (the docs say to add
    --pooling mean)."""
    with cpu_engine(tiny_gguf, tmp_path / "engine.log", "--embedding") as url, \
            pytest.raises(openai.BadRequestError, match="[Pp]ooling"):
        client(url).embeddings.create(model="tiny", input="hello")


def test_a_chat_model_serves_with_context_threads_parallel_batch_and_template(
        tiny_gguf: Path, tmp_path: Path) -> None:
    with cpu_engine(tiny_gguf, tmp_path / "engine.log", "--ctx-size", "512", "--threads",
                    "1", "--parallel", "2", "-b", "256", "-ub", "128",
                    "--chat-template", TEMPLATE) as url:
        reply = client(url).chat.completions.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "hello"}])
        props = call(url + "/props")
        prompt = call(url + "/apply-template",
                      {"messages": [{"role": "user", "content": "hello"}]})["prompt"]
    assert reply.choices[0].message.content is not None and reply.usage is not None
    assert reply.usage.completion_tokens >= 1
    assert props["total_slots"] == 2                                  # --parallel 2
    assert props["default_generation_settings"]["n_ctx"] == 256       # 512 shared by 2
    assert prompt == "[user] hello|"                                  # ours, not the model's
