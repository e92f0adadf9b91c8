"""The engine drivers: llama.cpp (``llama-server`` or the xllamacpp launcher) and vLLM.

Multi-node replicas: llama.cpp runs its RPC worker (``ggml-rpc-server``; ``rpc-server`` in
older builds) on every worker node (bound to the node's address, on the replica's rendezvous
port) and the head's ``llama-server`` gets ``--rpc addr:port,...``; the head waits until every
worker accepts connections. docs/engines.md says how it is wired. vLLM runs
``vllm serve`` on every node with ``--nnodes/--node-rank/--master-addr/--master-port``
(multiprocessing backend, no Ray); workers are ``--headless``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..fleetvocab import CPU_CLASS
from .base import (
    EngineDriver,
    LaunchSpec,
    assignment_args,
    engine_env,
    has_flag,
    peers_of,
    profile_sizes,
    rendezvous,
    resolve_source,
)
from .llamacpp_build import BUILD_HINT, find_rpc_server
from .owned import owned_flags_in, refuse_owned_flags
from .slots import slots_flag
from .xllamacpp_launcher import args_problem as cpu_engine_args_problem
from .xllamacpp_launcher import supported_flags as cpu_engine_flags

# The CPU engine runs as ``python -m LAUNCHER_MODULE``: a module nobody imports (run_cpu_engine
# says why), not the launcher itself.
LAUNCHER_MODULE = "llmgw_runtime.engines.run_cpu_engine"
CPU_ENGINE_DOC = 'docs/operations.md, "The CPU engine"'


def args_problem(engine: str, device_class: str, args: Sequence[object]) -> str | None:
    """Why the engine that runs an ``engine`` model on ``device_class`` devices would refuse
    ``args``, or None when it accepts them or cannot say. Pure: the catalog asks it at apply
    time. Only the CPU engine can say: llama.cpp on class cpu is the xllamacpp launcher (the
    wheel is CPU only; GPU nodes run a llama-server binary, whose flags vary by build), and it
    knows its flags. vLLM and llama-server accept anything here. Args that set what the
    agent owns are owned.py's to refuse, not this function's."""
    if engine != LlamaCppDriver.name or device_class != CPU_CLASS:
        return None
    return LlamaCppDriver(binary=None).args_problem(args)


class LlamaCppDriver(EngineDriver):
    """llama.cpp: the operator's ``llama-server`` binary, or, without one, the launcher
    module that runs llama.cpp's server from the ``xllamacpp`` wheel (CPU)."""

    name = "llama.cpp"
    health_path = "/health"

    def __init__(self, binary: str | None = None, python: str | None = None,
                 rpc_binary: str | None = None):
        self.binary = binary
        self.python = python or sys.executable
        self.rpc_binary = rpc_binary

    def args_problem(self, args: Sequence[object]) -> str | None:
        """Why this driver's engine would refuse ``args``; None when it accepts them or
        cannot say (a llama-server binary)."""
        if self.binary or owned_flags_in(self.name, args):
            return None
        problem = cpu_engine_args_problem(args)
        if problem is None:
            return None
        engine = f"the CPU engine (llama.cpp on class {CPU_CLASS}, the xllamacpp wheel)"
        if problem.unsupported:
            return (f"args {', '.join(problem.unsupported)} are not flags of {engine}; it "
                    f"accepts only {cpu_engine_flags(values=False)} ({CPU_ENGINE_DOC})")
        return f"args refused by {engine}: {problem} ({CPU_ENGINE_DOC})"

    def _rpc_server(self) -> str:
        """llama.cpp's RPC worker (``ggml-rpc-server``, ``rpc-server`` in older builds): as
        configured, else next to llama-server, else on PATH."""
        found = find_rpc_server(self.binary, self.rpc_binary)
        if found:
            return found
        if self.rpc_binary:
            raise EngineError(f"llama.cpp's RPC worker {self.rpc_binary!r} "
                              "(LLMGW_LLAMA_RPC_BINARY) is not found or not executable; fix "
                              f"the path, or {BUILD_HINT}")
        raise EngineError("llama.cpp's RPC worker (ggml-rpc-server or rpc-server) is not "
                          "found next to llama-server nor on PATH (needed on every worker "
                          "node of a multi-node llama.cpp replica); build llama.cpp with "
                          f"-DGGML_RPC=ON ({BUILD_HINT}) or set LLMGW_LLAMA_RPC_BINARY")

    def launch(self, assignment: Mapping[str, Any], *, host: str, port: int,
               weights_dirs: Sequence[str | Path] = ()) -> LaunchSpec:
        """llama-server (or the launcher) on ``host:port``; EngineError when the args set a
        flag the agent owns (owned.py)."""
        args = assignment_args(assignment)
        refuse_owned_flags(self.name, args, assignment.get("replica_id"))
        args += slots_flag(self.name, assignment.get("slots"), args)
        path = resolve_source(str(assignment["source"]), weights_dirs)
        model = str(assignment["model"])
        env = engine_env(assignment)
        wait: tuple[tuple[str, int], ...] = ()
        if assignment.get("role") == "head":
            rpc_port = rendezvous(assignment)
            wait = tuple((addr, rpc_port) for rank, addr in peers_of(assignment) if rank > 0)
            args = ["--rpc", ",".join(f"{a}:{p}" for a, p in wait), *args]
        if self.binary:
            binary = shutil.which(self.binary) or self.binary
            if not self._executable_exists(binary):
                raise EngineError(f"llama-server binary {self.binary!r} not found or not "
                                  "executable; install llama.cpp or fix "
                                  f"LLMGW_LLAMA_SERVER_BINARY ({BUILD_HINT})")
            argv = [binary, "-m", str(path), "--host", host, "--port", str(port),
                    "--alias", model, *args]
        else:
            if wait:
                raise EngineError("a multi-node llama.cpp replica needs llama-server built "
                                  "with RPC; set LLMGW_LLAMA_SERVER_BINARY (the xllamacpp "
                                  f"wheel has no RPC; {BUILD_HINT})")
            problem = self.args_problem(args)
            if problem:
                raise EngineError(f"replica {assignment.get('replica_id')}: {problem}")
            argv = [self.python, "-m", LAUNCHER_MODULE, "--model", str(path),
                    "--host", host, "--port", str(port), "--alias", model, *args]
        return LaunchSpec(argv=argv, env=env, health_path=self.health_path, wait_for=wait)

    def launch_worker(self, assignment: Mapping[str, Any], *,
                      weights_dirs: Sequence[str | Path] = ()) -> LaunchSpec:
        rank = int(assignment.get("rank") or 0)
        address = dict(peers_of(assignment)).get(rank)
        port = rendezvous(assignment)
        argv = [self._rpc_server(), "--host", str(address), "--port", str(port)]
        return LaunchSpec(argv=argv, env=engine_env(assignment), health="tcp", port=port)


class VllmDriver(EngineDriver):
    """vLLM's OpenAI server, run by the Python of its own virtual environment."""

    name = "vllm"
    health_path = "/health"

    def __init__(self, python: str):
        self.python = python

    def _argv(self, assignment: Mapping[str, Any],
              weights_dirs: Sequence[str | Path]) -> list[str]:
        args = assignment_args(assignment)
        refuse_owned_flags(self.name, args, assignment.get("replica_id"))
        args += slots_flag(self.name, assignment.get("slots"), args)
        path = resolve_source(str(assignment["source"]), weights_dirs)
        argv = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path),
                "--served-model-name", str(assignment["model"])]
        tp, pp = profile_sizes(assignment)
        if not has_flag(args, "--tensor-parallel-size", "-tp"):
            argv += ["--tensor-parallel-size", str(tp)]
        if not has_flag(args, "--pipeline-parallel-size", "-pp"):
            argv += ["--pipeline-parallel-size", str(pp)]
        if assignment.get("role") in ("head", "worker"):
            head = assignment.get("head_address")
            if not head:
                raise EngineError(f"replica {assignment.get('replica_id')}: the head node "
                                  "has no address; set LLMGW_ADDRESS on its agent")
            argv += ["--nnodes", str(int(assignment.get("nodes") or 1)),
                     "--node-rank", str(int(assignment.get("rank") or 0)),
                     "--master-addr", str(head),
                     "--master-port", str(rendezvous(assignment))]
        return argv + args

    def launch(self, assignment: Mapping[str, Any], *, host: str, port: int,
               weights_dirs: Sequence[str | Path] = ()) -> LaunchSpec:
        argv = self._argv(assignment, weights_dirs)
        argv[argv.index("--served-model-name") + 2:argv.index("--served-model-name") + 2] = [
            "--host", host, "--port", str(port)]
        return LaunchSpec(argv=argv, env=engine_env(assignment), health_path=self.health_path)

    def launch_worker(self, assignment: Mapping[str, Any], *,
                      weights_dirs: Sequence[str | Path] = ()) -> LaunchSpec:
        argv = self._argv(assignment, weights_dirs) + ["--headless"]
        return LaunchSpec(argv=argv, env=engine_env(assignment), health="process")


def drivers_from_config(llama_server_binary: str | None = None,
                        vllm_python: str | None = None,
                        llama_rpc_binary: str | None = None) -> dict[str, EngineDriver]:
    """The drivers this node has, keyed by engine name; the keys are the engines the agent
    reports as installed. vLLM only when ``vllm_python`` is set and exists."""
    drivers: dict[str, EngineDriver] = {
        "llama.cpp": LlamaCppDriver(llama_server_binary, rpc_binary=llama_rpc_binary)}
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
            f"install llama.cpp or fix LLMGW_LLAMA_SERVER_BINARY ({BUILD_HINT})")
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
