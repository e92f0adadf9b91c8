"""`llmgw doctor` says which llama.cpp build the node's agent runs: the real `llama-server`
that `make llama-cpp` built (version, pinned source, RPC and its worker), an operator's copy
without its RPC worker, or the CPU engine without RPC."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw_runtime.cli.main import cli
from tests.engines.test_llamacpp_build import pin


@pytest.fixture(autouse=True)
def no_local_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "up-state"
    state.mkdir()
    monkeypatch.setenv("LLMGW_STATE_DIR", str(state))
    for key in ("LLMGW_DEVICES", "LLMGW_CONTROL_URL", "LLMGW_LLAMA_SERVER_BINARY",
                "LLMGW_LLAMA_RPC_BINARY"):
        monkeypatch.delenv(key, raising=False)


def doctor(tmp_path: Path, *lines: str, fmt: str = "table") -> tuple[int, str]:
    env = tmp_path / "agent.env"
    env.write_text("\n".join(["LLMGW_CONTROL_URL=http://127.0.0.1:1", "LLMGW_DEVICES=cpu",
                              *lines]) + "\n")
    result = CliRunner().invoke(cli, ["doctor", "--env-file", str(env), "-o", fmt])
    return result.exit_code, result.output


def test_the_built_llama_server_is_reported_with_its_version_source_and_rpc_worker(
        tmp_path: Path, llama_cpp_bin: Path) -> None:
    server = llama_cpp_bin / "llama-server"
    _, out = doctor(tmp_path, f"LLMGW_LLAMA_SERVER_BINARY={server}")
    line = next(ln for ln in out.splitlines() if "[llama.cpp]" in ln)
    assert line.startswith(f"ok   [llama.cpp] llama-server {server}: version: "), out
    assert f"; built from llama-cpp-python {pin()['LLAMA_CPP_PY_VERSION']}, llama.cpp " \
           f"commit {pin()['LLAMA_CPP_COMMIT'][:9]} " in line, line
    assert f"; RPC: yes, worker {llama_cpp_bin / 'ggml-rpc-server'}" in line, line
    _, out = doctor(tmp_path, f"LLMGW_LLAMA_SERVER_BINARY={server}", fmt="json")
    build = json.loads(out)["llama_cpp"]
    assert build["rpc"] is True and build["source"].startswith("llama-cpp-python ")
    assert build["rpc_server"] == str(llama_cpp_bin / "ggml-rpc-server")
    assert "-DGGML_RPC=ON" in build["cmake_flags"]
    assert build["llama_cpp_commit"] == pin()["LLAMA_CPP_COMMIT"]


def test_a_llama_server_whose_rpc_worker_is_missing_is_a_warning_saying_what_to_do(
        tmp_path: Path, llama_cpp_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "opt" / "llama-server"
    copy.parent.mkdir()
    copy.write_bytes((llama_cpp_bin / "llama-server").read_bytes())
    copy.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    _, out = doctor(tmp_path, f"LLMGW_LLAMA_SERVER_BINARY={copy}")
    assert f"WARN [llama.cpp] llama-server {copy}: version: " in out, out
    assert "RPC: yes, but no RPC worker (ggml-rpc-server or rpc-server)" in out
    assert "what to do: put llama.cpp's RPC worker (ggml-rpc-server or rpc-server) next to " \
           "llama-server or set LLMGW_LLAMA_RPC_BINARY; build one with `make llama-cpp`" in out


def test_without_a_binary_the_cpu_engine_is_reported_without_rpc(tmp_path: Path) -> None:
    _, out = doctor(tmp_path)
    assert "ok   [llama.cpp] xllamacpp (the CPU engine): xllamacpp " in out, out
    assert "no RPC: single-node replicas only" in out
