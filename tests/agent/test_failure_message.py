"""A failed start's message, as operators read it: the agent's supervisor with the real CPU
engine (the xllamacpp launcher) on 127.0.0.1, and the one line every view shows of it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.agent import Supervisor
from llmgw_runtime.engines import drivers_from_config
from llmgw_runtime.status.telling import telling_line
from tests.support.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.slow


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    sup = Supervisor(tmp_path / "run", drivers_from_config(), start_timeout_s=20,
                     stop_grace_s=5)
    try:
        yield sup
    finally:
        sup.stop_all()


def assignment(rid: str, source: Path, args: list[str]) -> dict[str, Any]:
    return {"replica_id": rid, "model": "tiny", "engine": "llama.cpp", "source": str(source),
            "args": args, "devices": [0], "device_uuids": ["cpu-test"], "device_kind": "cpu"}


def test_a_truncated_model_fails_with_llamacpps_reason_as_its_telling_line(
        supervisor: Supervisor, tmp_path: Path) -> None:
    good = write_tiny_gguf(tmp_path / "tiny.gguf")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good.read_bytes()[:100_000])
    supervisor.start(assignment("r-1", truncated, ["--ctx-size", "256"]))
    state = supervisor.wait_for("r-1", {"ready", "failed"}, timeout_s=20)
    assert state["state"] == "failed"
    assert telling_line(state["last_error"]) == (
        "engine exited with code 1: llama_model_load: error loading model: tensor "
        "'output.weight' data is not within the file bounds, model is corrupted or incomplete")


def test_a_failure_message_holds_only_this_starts_log_lines(supervisor: Supervisor,
                                                             tmp_path: Path) -> None:
    # An earlier start of this replica id left its own error in the log (an agent restart).
    supervisor.run_dir.mkdir(parents=True, exist_ok=True)
    supervisor.log_path("r-3").write_text(
        "--- llmgw: starting r-3 (tiny) at an earlier time: ...\n"
        "0.00.000.001 E srv start: couldn't bind HTTP server socket, port: 1\n")
    missing = tmp_path / "missing.gguf"
    supervisor.start(assignment("r-3", missing, ["--ctx-size", "256"]))
    state = supervisor.wait_for("r-3", {"ready", "failed"}, timeout_s=20)
    assert state["state"] == "failed"
    assert f"model file not found: {missing}" in state["last_error"]
    assert "couldn't bind" not in state["last_error"]


def test_args_the_cpu_engine_lacks_fail_at_once_naming_them_without_a_process(
        supervisor: Supervisor, tmp_path: Path) -> None:
    """A model stored before the apply-time check: the agent refuses it in the same words."""
    state = supervisor.start(assignment("r-2", tmp_path / "tiny.gguf", ["--embeddingz"]))
    assert state["state"] == "failed" and state["pid"] is None
    assert telling_line(state["last_error"]).startswith(
        "replica r-2: args --embeddingz are not flags of the CPU engine")
