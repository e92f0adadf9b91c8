"""The whole path with real processes: store -> control -> agent -> llama.cpp -> router ->
the real openai client."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.procs import pid_alive, wait_until

from .conftest import Cluster, tiny_catalog

pytestmark = pytest.mark.slow


def chat(client: openai.OpenAI, model: str = "tiny", **kw: Any) -> Any:
    return client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, **kw)


def test_openai_client_through_the_router_on_both_stores(cluster_factory: Any,
                                                         tiny_model: Path,
                                                         store_url: str) -> None:
    c: Cluster = cluster_factory(store_url)
    c.start_control()
    c.apply(tiny_catalog(tiny_model))
    c.start_router()
    c.start_agent()
    c.wait_ready("tiny")
    client = openai.OpenAI(base_url=c.router_url + "/v1", api_key="unused", max_retries=0)

    assert [m.id for m in client.models.list().data] == ["tiny"]
    reply = chat(client)
    assert reply.model and reply.choices[0].message.role == "assistant"
    assert reply.usage is not None and reply.usage.prompt_tokens > 0

    completion = client.completions.create(model="tiny", prompt="Once", max_tokens=12,
                                           extra_body={"ignore_eos": True})
    assert completion.usage is not None and completion.usage.completion_tokens == 12

    # Greedy, so the same tokens every run: the tiny model's random tokens are often bytes
    # of one UTF-8 character, which the engine sends together in one chunk.
    chunks = list(client.completions.create(model="tiny", prompt="Once", max_tokens=10,
                                            temperature=0, stream=True,
                                            extra_body={"ignore_eos": True}))
    assert len([ch for ch in chunks if ch.choices and ch.choices[0].text]) >= 3
    streamed_chat = list(chat(client, stream=True))
    assert streamed_chat[-1].choices[0].finish_reason in ("stop", "length")


def test_unknown_model_is_a_404_model_not_found(cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        chat(client, model="no-such-model")
    assert info.value.code == "model_not_found"


def test_a_bad_model_path_fails_with_the_engines_message(cluster: Cluster) -> None:
    cluster.apply(tiny_catalog(Path("/nonexistent/missing.gguf"), name="broken"))

    def failed() -> dict[str, Any] | None:
        model = cluster.model("broken")
        return model if model["consecutive_failures"] >= 1 else None

    model = wait_until(failed, 30, "the broken model's first failed start")
    assert "model file not found: /nonexistent/missing.gguf" in model["last_error"]
    events = cluster.admin.get("/api/v1/events")["events"]
    assert any(e["kind"] == "failure" and e["subject"] == "broken" for e in events)
    # The good model is untouched.
    assert cluster.model("tiny")["state"] == "ready"


def test_agent_kill_9_keeps_the_engine_serving_and_a_new_agent_adopts_it(
        cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="x", max_retries=0)
    [before] = cluster.replicas("tiny")
    agent = cluster.procs["agent"]
    os.kill(agent.pid, signal.SIGKILL)
    agent.proc.wait()
    assert pid_alive(before["pid"]), "killing the agent killed its engine"
    assert chat(client).choices, "the replica stopped serving when its agent died"

    cluster.start_agent("agent2")
    time.sleep(2)  # a few report cycles of the new agent
    [after] = cluster.replicas("tiny")
    assert (after["id"], after["pid"], after["port"]) == \
        (before["id"], before["pid"], before["port"])
    assert after["state"] == "ready"
    assert chat(client).choices
    events = cluster.admin.get("/api/v1/events?limit=200")["events"]
    assert not any(e["kind"] == "failure" for e in events)


def test_no_secret_appears_in_any_log(cluster: Cluster) -> None:
    client = openai.OpenAI(base_url=cluster.router_url + "/v1", api_key="x", max_retries=0)
    chat(client)
    cluster.admin.get("/api/v1/models")
    credential = (cluster.agent_dir / "credential").read_text().strip()
    assert (cluster.agent_dir / "credential").stat().st_mode & 0o077 == 0
    secrets = [cluster.admin_token, cluster.join_token, cluster.router_token, credential]
    logs = list(cluster.root.rglob("*.log"))
    assert len(logs) >= 4   # control, router, agent, the engine's own
    for log in logs:
        text = log.read_text(errors="replace")
        for secret in secrets:
            assert secret not in text, f"a secret is in {log}"
