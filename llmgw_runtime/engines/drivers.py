"""The engine drivers: llama.cpp (``llama-server`` or the xllamacpp launcher) and vLLM."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import EngineError
from .base import EngineDriver, LaunchSpec, assignment_args, engine_env, resolve_source

LAUNCHER_MODULE = "llmgw_runtime.engines.xllamacpp_launcher"


class LlamaCppDriver(EngineDriver):
    """llama.cpp: the operator's ``llama-server`` binary, or, without one, the launcher
    module that runs llama.cpp's server from the ``xllamacpp`` wheel (CPU)."""

    name = "llama.cpp"
    health_path = "/health"

    def __init__(self, binary: str | None = None, python: str | None = None):
        self.binary = binary
        self.python = python or sys.executable

    def launch(self, assignment: Mapping[str, Any], *, host: str, port: int,
               weights_dirs: Sequence[str | Path] = ()) -> LaunchSpec:
        path = resolve_source(str(assignment["source"]), weights_dirs)
        model = str(assignment["model"])
        args = assignment_args(assignment)
        env = engine_env(assignment)
        if self.binary:
            binary = shutil.which(self.binary) or self.binary
            if not self._executable_exists(binary):
                raise EngineError(f"llama-server binary {self.binary!r} not found or not "
                                  "executable; install llama.cpp or fix "
                                  "LLMGW_LLAMA_SERVER_BINARY")
            argv = [binary, "-m", str(path), "--host", host, "--port", str(port),
                    "--alias", model, *args]
        else:
            argv = [self.python, "-m", LAUNCHER_MODULE, "--model", str(path),
                    "--host", host, "--port", str(port), "--alias", model, *args]
        return LaunchSpec(argv=argv, env=env, health_path=self.health_path)


class VllmDriver(EngineDriver):
    """vLLM's OpenAI server, run by the Python of its own virtual environment."""

    name = "vllm"
    health_path = "/health"

    def __init__(self, python: str):
        self.python = python

    def launch(self, assignment: Mapping[str, Any], *, host: str, port: int,
               weights_dirs: Sequence[str | Path] = ()) -> LaunchSpec:
        path = resolve_source(str(assignment["source"]), weights_dirs)
        model = str(assignment["model"])
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path),
                "--served-model-name", model, "--host", host, "--port", str(port),
                *assignment_args(assignment)]
        return LaunchSpec(argv=argv, env=engine_env(assignment), health_path=self.health_path)


def drivers_from_config(llama_server_binary: str | None = None,
                        vllm_python: str | None = None) -> dict[str, EngineDriver]:
    """The drivers this node has, keyed by engine name; the keys are the engines the agent
    reports as installed. vLLM only when ``vllm_python`` is set and exists."""
    drivers: dict[str, EngineDriver] = {"llama.cpp": LlamaCppDriver(llama_server_binary)}
    if vllm_python and os.path.isfile(os.path.expanduser(vllm_python)):
        drivers["vllm"] = VllmDriver(os.path.expanduser(vllm_python))
    return drivers


def engine_problems(llama_server_binary: str | None = None,
                    vllm_python: str | None = None) -> dict[str, str | None]:
    """Each engine this configuration offers, with what keeps it from running (or None)."""
    out: dict[str, str | None] = {}
    if llama_server_binary:
        found = shutil.which(llama_server_binary) or llama_server_binary
        ok = os.path.isfile(found) and os.access(found, os.X_OK)
        out["llama.cpp"] = None if ok else (
            f"llama-server binary {llama_server_binary!r} is not found or not executable; "
            "install llama.cpp or fix LLMGW_LLAMA_SERVER_BINARY")
    else:
        import importlib.util

        out["llama.cpp"] = None if importlib.util.find_spec("xllamacpp") else (
            "no llama-server binary (LLMGW_LLAMA_SERVER_BINARY) and no xllamacpp package")
    if vllm_python:
        path = os.path.expanduser(vllm_python)
        out["vllm"] = None if os.path.isfile(path) else (
            f"vLLM's python {vllm_python!r} does not exist; create vLLM's virtualenv or fix "
            "LLMGW_VLLM_PYTHON")
    return out
