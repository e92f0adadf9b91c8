import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.engines import (
    LAUNCHER_MODULE,
    LlamaCppDriver,
    VllmDriver,
    cuda_visible_devices,
    drivers_from_config,
    resolve_source,
)
from llmgw_runtime.engines.drivers import args_problem
from llmgw_runtime.errors import EngineError


def assignment(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "replica_id": "r-1", "model": "qwen", "engine": "llama.cpp",
        "source": "file:///srv/models/qwen.gguf", "args": ["--ctx-size", "8192"],
        "devices": [0], "device_uuids": ["cpu-host"], "device_kind": "cpu"}
    base.update(over)
    return base


def test_llamacpp_with_a_binary_runs_llama_server(tmp_path: Path) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    spec = LlamaCppDriver(str(binary)).launch(assignment(), host="127.0.0.1", port=4000)
    assert spec.argv == [str(binary), "-m", "/srv/models/qwen.gguf", "--host", "127.0.0.1",
                         "--port", "4000", "--alias", "qwen", "--ctx-size", "8192"]
    assert spec.env["CUDA_VISIBLE_DEVICES"] == ""
    assert spec.health_path == "/health"


def test_llamacpp_with_a_missing_binary_says_so() -> None:
    with pytest.raises(EngineError, match="LLMGW_LLAMA_SERVER_BINARY"):
        LlamaCppDriver("/nonexistent/llama-server").launch(assignment(), host="h", port=1)


def test_llamacpp_without_a_binary_uses_the_xllamacpp_launcher() -> None:
    spec = LlamaCppDriver().launch(assignment(source="/m/q.gguf", args=[]),
                                   host="127.0.0.1", port=4001)
    assert spec.argv == [sys.executable, "-m", LAUNCHER_MODULE, "--model", "/m/q.gguf",
                         "--host", "127.0.0.1", "--port", "4001", "--alias", "qwen"]


def test_vllm_argv_on_two_whole_gpus_uses_uuids_never_indexes() -> None:
    a = assignment(engine="vllm", device_kind="gpu", devices=[0, 1],
                   device_uuids=["GPU-aaa", "GPU-bbb"], args=["--max-model-len", "4096"],
                   profile={"gpus": 2, "tp": 2, "pp": 1, "nodes": 1})
    spec = VllmDriver("/opt/vllm/bin/python").launch(a, host="0.0.0.0", port=4002)
    assert spec.argv == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server",
                         "--model", "/srv/models/qwen.gguf", "--served-model-name", "qwen",
                         "--host", "0.0.0.0", "--port", "4002",
                         "--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
                         "--max-model-len", "4096"]
    assert spec.env == {"CUDA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb"}
    assert spec.health_path == "/health"


@pytest.mark.parametrize("uuid", ["MIG-1234-abcd", "1234-abcd"])
def test_mig_instance_gets_one_mig_uuid_without_double_prefix(uuid: str) -> None:
    a = assignment(device_kind="mig", devices=[1001], device_uuids=[uuid])
    assert cuda_visible_devices(a) == "MIG-1234-abcd"


@pytest.mark.parametrize("over, message", [
    ({"device_kind": "mig", "device_uuids": ["a", "b"]}, "exactly one instance"),
    ({"device_kind": "gpu", "device_uuids": []}, "no device_uuids"),
    ({"device_kind": "tpu"}, "unknown"),
])
def test_bad_device_assignments_are_refused(over: dict[str, Any], message: str) -> None:
    with pytest.raises(EngineError, match=message):
        cuda_visible_devices(assignment(**over))


def test_resolve_file_url_and_absolute_path() -> None:
    assert resolve_source("file:///srv/m.gguf") == Path("/srv/m.gguf")
    assert resolve_source("/srv/m.gguf") == Path("/srv/m.gguf")


def test_resolve_hf_source_finds_the_file_in_a_weights_dir(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "q4.gguf").write_bytes(b"x")
    found = resolve_source("hf://Org/Repo-GGUF/q4.gguf", [str(tmp_path / "a"), tmp_path / "b"])
    assert found == tmp_path / "b" / "q4.gguf"


def test_resolve_hf_source_missing_says_where_it_looked_and_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(EngineError) as err:
        resolve_source("hf://Org/Repo/q4.gguf", [str(tmp_path)])
    text = str(err.value)
    assert "hf://Org/Repo/q4.gguf" in text and str(tmp_path) in text
    assert "LLMGW_WEIGHTS_DIRS" in text


@pytest.mark.parametrize("source", ["https://example.com/m.gguf", "relative/m.gguf",
                                    "file://host/m.gguf", "hf://only-org"])
def test_unsupported_sources_are_refused_naming_the_source(source: str) -> None:
    with pytest.raises(EngineError, match="source"):
        resolve_source(source, [])


def test_drivers_from_config_offers_vllm_only_when_its_python_exists(tmp_path: Path) -> None:
    assert sorted(drivers_from_config(None, None)) == ["llama.cpp"]
    assert sorted(drivers_from_config(None, str(tmp_path / "none"))) == ["llama.cpp"]
    python = tmp_path / "python"
    python.write_text("")
    drivers = drivers_from_config("/usr/bin/llama-server", str(python))
    assert sorted(drivers) == ["llama.cpp", "vllm"]
    assert drivers["vllm"].name == "vllm" and drivers["llama.cpp"].name == "llama.cpp"
    vllm = drivers["vllm"]
    assert isinstance(vllm, VllmDriver) and vllm.python == os.fspath(python)


def test_engines_inherit_no_secret_and_no_device_choice_of_their_own() -> None:
    from llmgw_runtime.agent.supervisor import inherited_env
    from llmgw_runtime.engines.base import engine_env

    agent_env = {"PATH": "/usr/bin", "LLMGW_JOIN_TOKEN": "secret",
                 "CUDA_VISIBLE_DEVICES": "0,1", "GGML_VK_VISIBLE_DEVICES": "0"}
    env = inherited_env(agent_env)
    env.update(engine_env(assignment(device_kind="mig", devices=[1002],
                                     device_uuids=["MIG-aa"])))
    assert env == {"PATH": "/usr/bin", "CUDA_VISIBLE_DEVICES": "MIG-aa"}
    gpu = inherited_env(agent_env)
    gpu.update(engine_env(assignment(device_kind="gpu", devices=[0, 1],
                                     device_uuids=["GPU-a", "GPU-b"])))
    assert gpu["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert "GGML_VK_VISIBLE_DEVICES" not in gpu


def test_vllm_keeps_the_operators_own_parallel_flags() -> None:
    a = assignment(engine="vllm", args=["--tensor-parallel-size=4", "-pp", "2"],
                   profile={"gpus": 8, "tp": 8, "pp": 1, "nodes": 1})
    argv = VllmDriver("/py").launch(a, host="h", port=1).argv
    assert argv.count("--tensor-parallel-size=4") == 1
    assert "--tensor-parallel-size" not in argv and "--pipeline-parallel-size" not in argv


def multi_node(rank: int, engine: str = "vllm") -> dict[str, Any]:
    return assignment(
        engine=engine, device_kind="gpu", devices=[0, 1], device_uuids=["GPU-a", "GPU-b"],
        profile={"gpus": 2, "tp": 2, "pp": 2, "nodes": 2}, args=[],
        role="head" if rank == 0 else "worker", rank=rank, nodes=2, rendezvous_port=29501,
        head_address="10.0.0.1",
        peers=[{"rank": 0, "node": "gpu-01", "address": "10.0.0.1"},
               {"rank": 1, "node": "gpu-02", "address": "10.0.0.2"}])


def test_vllm_multi_node_head_and_worker_meet_at_the_rendezvous_port() -> None:
    head = VllmDriver("/py").launch(multi_node(0), host="0.0.0.0", port=8000)
    assert head.argv[-8:] == ["--nnodes", "2", "--node-rank", "0", "--master-addr",
                              "10.0.0.1", "--master-port", "29501"]
    assert "--headless" not in head.argv and head.health == "http"
    worker = VllmDriver("/py").launch_worker(multi_node(1))
    assert worker.argv[-9:] == ["--nnodes", "2", "--node-rank", "1", "--master-addr",
                                "10.0.0.1", "--master-port", "29501", "--headless"]
    assert "--port" not in worker.argv and worker.health == "process"
    assert worker.env == {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}
    assert ["--tensor-parallel-size", "2"] == worker.argv[7:9]


def executables(*paths: Path) -> None:
    for b in paths:
        b.write_text("#!/bin/sh\n")
        b.chmod(0o755)


def test_llamacpp_multi_node_head_waits_for_rpc_workers(tmp_path: Path) -> None:
    binary = tmp_path / "llama-server"
    rpc = tmp_path / "ggml-rpc-server"          # the worker's name since llama.cpp ~b6000
    executables(binary, rpc)
    driver = LlamaCppDriver(str(binary))
    a = multi_node(0, engine="llama.cpp")
    head = driver.launch(a, host="0.0.0.0", port=8000)
    assert head.argv[head.argv.index("--rpc") + 1] == "10.0.0.2:29501"
    assert head.wait_for == (("10.0.0.2", 29501),)
    worker = driver.launch_worker(multi_node(1, engine="llama.cpp"))
    assert worker.argv == [str(rpc), "--host", "10.0.0.2", "--port", "29501"]
    assert worker.health == "tcp" and worker.port == 29501


def test_llamacpp_older_builds_rpc_server_is_found_next_to_llama_server(
        tmp_path: Path) -> None:
    binary, rpc = tmp_path / "llama-server", tmp_path / "rpc-server"
    executables(binary, rpc)
    worker = LlamaCppDriver(str(binary)).launch_worker(multi_node(1, engine="llama.cpp"))
    assert worker.argv[0] == str(rpc)


def test_llamacpp_configured_rpc_worker_wins_over_the_one_next_to_llama_server(
        tmp_path: Path) -> None:
    binary, near, chosen = (tmp_path / "llama-server", tmp_path / "ggml-rpc-server",
                            tmp_path / "my-rpc")
    executables(binary, near, chosen)
    worker = LlamaCppDriver(str(binary), rpc_binary=str(chosen)).launch_worker(
        multi_node(1, engine="llama.cpp"))
    assert worker.argv[0] == str(chosen)


def test_llamacpp_worker_without_rpc_server_says_how_to_get_one(tmp_path: Path,
                                                                monkeypatch: Any) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EngineError, match="ggml-rpc-server or rpc-server.*GGML_RPC=ON.*"
                                          "make llama-cpp"):
        LlamaCppDriver(str(tmp_path / "none")).launch_worker(multi_node(1, engine="llama.cpp"))
    with pytest.raises(EngineError, match="'.*nope'.*LLMGW_LLAMA_RPC_BINARY.*make llama-cpp"):
        LlamaCppDriver(str(tmp_path / "none"), rpc_binary=str(tmp_path / "nope")
                       ).launch_worker(multi_node(1, engine="llama.cpp"))


def test_a_part_whose_peer_has_no_address_names_the_node() -> None:
    a = multi_node(0, engine="llama.cpp")
    a["peers"][1]["address"] = None
    with pytest.raises(EngineError, match="'gpu-02'.*LLMGW_ADDRESS"):
        LlamaCppDriver("/bin/sh").launch(a, host="h", port=1)


# -- flags the agent owns ------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["--host", "0.0.0.0"], ["--host=0.0.0.0"], ["--ho", "0.0.0.0"], ["--port", "80"],
    ["-m", "/etc/shadow"], ["--alias", "other"], ["--api-key", "k"], ["--log-file", "/x"],
])
def test_llamacpp_refuses_args_that_set_what_the_agent_owns(args: list[str]) -> None:
    with pytest.raises(EngineError) as info:
        LlamaCppDriver().launch(assignment(args=["--ctx-size", "512", *args]),
                                host="127.0.0.1", port=4000)
    flag = args[0].split("=")[0]
    assert info.value.message == (
        f"replica r-1: args {flag} set what the agent owns for llama.cpp (where the engine "
        "listens, which weights it loads and under which name, keys and TLS, files on the "
        "node); remove them: llmgw sets these itself")


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--served_model_name", "x"],
                                  ["--download-dir=/etc"], ["--config", "c.yaml"]])
def test_vllm_refuses_args_that_set_what_the_agent_owns(args: list[str]) -> None:
    driver = VllmDriver("/opt/vllm/bin/python")
    a = assignment(engine="vllm", device_kind="gpu", device_uuids=["GPU-a"], args=args)
    with pytest.raises(EngineError, match=f"args {args[0].split('=')[0]} set what the agent "
                                          "owns for vllm"):
        driver.launch(a, host="127.0.0.1", port=4002)
    with pytest.raises(EngineError, match="set what the agent owns"):
        driver.launch_worker({**a, "role": "worker", "rank": 1, "nodes": 2,
                              "head_address": "10.0.0.1", "rendezvous_port": 29500})


def test_the_agent_and_the_catalog_word_an_owned_flag_alike() -> None:
    from llmgw_runtime.catalog import parse as catalog
    from llmgw_runtime.errors import CatalogError

    with pytest.raises(CatalogError) as from_catalog:
        catalog.validate({"models": [{"name": "qwen", "source": "/m/q.gguf",
                                      "engine": "llama.cpp", "profile": {"class": "cpu"},
                                      "args": ["--host", "0.0.0.0"]}]})
    with pytest.raises(EngineError) as from_agent:
        LlamaCppDriver().launch(assignment(args=["--host", "0.0.0.0"]), host="h", port=1)
    [detail] = from_catalog.value.details
    assert detail.split(": ", 1)[1] == from_agent.value.message.split(": ", 1)[1]


def test_vllm_keeps_tensor_parallel_args_it_lets_the_catalog_set() -> None:
    a = assignment(engine="vllm", device_kind="gpu", device_uuids=["GPU-a"],
                   args=["--tensor-parallel-size", "1", "--tokenizer", "org/repo"])
    spec = VllmDriver("/opt/vllm/bin/python").launch(a, host="127.0.0.1", port=4002)
    assert spec.argv[-4:] == ["--tensor-parallel-size", "1", "--tokenizer", "org/repo"]
    assert spec.argv.count("--tensor-parallel-size") == 1


# -- which args an engine accepts ------------------------------------------------------------

def test_the_cpu_engine_refuses_a_flag_it_lacks_before_starting_anything() -> None:
    with pytest.raises(EngineError) as info:
        LlamaCppDriver().launch(assignment(args=["--n-gpu-layers", "99"]), host="h", port=1)
    assert "replica r-1: args --n-gpu-layers are not flags of the CPU engine" in str(info.value)
    assert "--ctx-size/-c" in str(info.value)


def test_a_llama_server_binary_gets_any_args(tmp_path: Path) -> None:
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    driver = LlamaCppDriver(str(binary))
    assert driver.args_problem(["--n-gpu-layers", "99"]) is None
    spec = driver.launch(assignment(args=["-ngl", "99"]), host="h", port=1)
    assert spec.argv[-2:] == ["-ngl", "99"]


@pytest.mark.parametrize("engine, klass, args, refused", [
    ("llama.cpp", "cpu", ["--flash-attn", "on"], "args --flash-attn are not flags"),
    ("llama.cpp", "cpu", ["-c", "x"], "'x' is not a whole number"),
    ("llama.cpp", "cpu", ["--embeddings", "--pooling", "mean", "-c", "512"], None),
    ("llama.cpp", "cpu", ["--host", "0.0.0.0"], None),       # owned: owned.py refuses it
    ("llama.cpp", "a100-80g", ["--flash-attn", "on", "-ngl", "99"], None),
    ("vllm", "cpu", ["--max-model-len", "4096"], None),
    ("vllm", "h100-80g", ["--anything"], None),
])
def test_only_the_engine_that_can_say_checks_args(engine: str, klass: str, args: list[str],
                                                  refused: str | None) -> None:
    problem = args_problem(engine, klass, args)
    assert (problem is None) == (refused is None)
    assert refused is None or (problem is not None and refused in problem)
