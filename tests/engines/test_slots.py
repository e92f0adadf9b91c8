"""A replica's slots, known from its launch: the catalog's, the engine's flag, the engine's
default; and the flag the driver adds so the engine runs what the router counts."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.engines import LAUNCHER_MODULE, LlamaCppDriver, VllmDriver
from llmgw_runtime.engines.slots import (
    LLAMA_SERVER_DEFAULT_SLOTS,
    VLLM_DEFAULT_SLOTS,
    slots_flag,
    slots_of,
)


def spec(engine: str = "llama.cpp", klass: str = "cpu", args: tuple[str, ...] = (),
         slots: int | None = None) -> catalog.ModelSpec:
    # built without validation: an engine llmgw does not know is one case
    return catalog.ModelSpec.model_construct(
        name="m", source="/m.gguf", engine=engine, args=args, slots=slots,
        profile=catalog.Profile.model_validate({"class": klass}))


@pytest.mark.parametrize(("engine", "klass", "args", "slots", "expected"), [
    ("llama.cpp", "cpu", (), None, 1),                          # the CPU engine's default
    ("llama.cpp", "a100-80g", (), None, LLAMA_SERVER_DEFAULT_SLOTS),  # llama-server's auto
    ("llama.cpp", "a100-80g", ("--parallel", "8"), None, 8),
    ("llama.cpp", "cpu", ("-np", "3"), None, 3),
    ("llama.cpp", "cpu", ("--parallel=6",), None, 6),
    ("llama.cpp", "cpu", ("--parallel", "2", "-np", "5"), None, 5),  # the last one wins
    ("llama.cpp", "a100-80g", ("--parallel", "-1"), None, None),     # auto: unknown
    ("llama.cpp", "a100-80g", ("--ctx-size", "8192"), 16, 16),       # the catalog's
    ("llama.cpp", "a100-80g", ("--parallel", "16"), 16, 16),
    ("vllm", "h100-80g", (), None, VLLM_DEFAULT_SLOTS),
    ("vllm", "h100-80g", ("--max-num-seqs", "64"), None, 64),
    ("vllm", "h100-80g", ("--max-num-seqs=32",), None, 32),
    ("vllm", "h100-80g", (), 128, 128),
    ("sglang", "h100-80g", (), None, None),                        # an engine llmgw does not know
    ("sglang", "h100-80g", (), 8, 8),
])
def test_slots_of_a_model(engine: str, klass: str, args: tuple[str, ...], slots: int | None,
                          expected: int | None) -> None:
    assert slots_of(spec(engine, klass, args, slots)) == expected


@pytest.mark.parametrize(("engine", "slots", "args", "added"), [
    ("llama.cpp", 8, [], ["--parallel", "8"]),
    ("llama.cpp", 8, ["-np", "8"], []),                  # the args set it: left alone
    ("llama.cpp", None, [], []),                         # no slots: the engine's default
    ("vllm", 64, ["--max-model-len", "4096"], ["--max-num-seqs", "64"]),
    ("vllm", 64, ["--max-num-seqs=64"], []),
    ("sglang", 4, [], []),
])
def test_the_flag_a_driver_adds_for_the_catalogs_slots(engine: str, slots: int | None,
                                                       args: list[str],
                                                       added: list[str]) -> None:
    assert slots_flag(engine, slots, args) == added


def assignment(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "replica_id": "r-1", "model": "qwen", "engine": "llama.cpp", "source": "/m/q.gguf",
        "args": [], "devices": [0], "device_uuids": ["cpu-host"], "device_kind": "cpu"}
    return {**base, **over}


def test_the_cpu_engine_is_launched_with_the_catalogs_slots() -> None:
    spec_ = LlamaCppDriver().launch(assignment(slots=4), host="127.0.0.1", port=4001)
    assert spec_.argv == [sys.executable, "-m", LAUNCHER_MODULE, "--model", "/m/q.gguf",
                          "--host", "127.0.0.1", "--port", "4001", "--alias", "qwen",
                          "--parallel", "4"]


def test_vllm_is_launched_with_the_catalogs_slots_unless_its_args_set_them() -> None:
    driver = VllmDriver("/opt/vllm/bin/python")
    a = assignment(engine="vllm", device_kind="gpu", device_uuids=["GPU-a"], slots=64,
                   profile={"gpus": 1, "tp": 1, "pp": 1, "nodes": 1})
    argv = driver.launch(a, host="0.0.0.0", port=4002).argv
    assert argv[-2:] == ["--max-num-seqs", "64"]
    argv = driver.launch({**a, "args": ["--max-num-seqs", "64"]}, host="0.0.0.0",
                         port=4002).argv
    assert argv.count("--max-num-seqs") == 1


def test_slots_survive_the_store_round_trip_and_change_the_definition() -> None:
    text = ("models: [{name: m, source: /m.gguf, engine: llama.cpp, profile: {class: cpu}"
            "%s}]")
    plain, = catalog.parse(text % "")
    sized, = catalog.parse(text % ", slots: 4")
    assert sized.slots == 4 and plain.slots is None
    assert plain.definition_hash != sized.definition_hash
    # a catalog without the new settings keeps the definition it had before they existed
    old = catalog.ModelSpec(name="m", source="/m.gguf", engine="llama.cpp",
                            profile=catalog.Profile.model_validate({"class": "cpu"}))
    assert plain.definition_hash == old.definition_hash
