"""What every engine driver does: turn an assignment into a command line and environment."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import EngineError
from ..weights.locate import resolve as resolve_weights


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one engine process and how to tell it is healthy."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    # How the agent tells it is up: "http" (GET health_path on the engine's port), "tcp"
    # (the port accepts connections: a llama.cpp RPC worker) or "process" (alive: a
    # headless vLLM worker). ``port`` is set when the engine must listen on a given port.
    health: str = "http"
    port: int | None = None
    # Peers that must accept connections before this part starts (llama.cpp's head waits
    # for its RPC workers).
    wait_for: tuple[tuple[str, int], ...] = ()


def resolve_source(source: str, weights_dirs: Sequence[str | Path] = ()) -> Path:
    """Where the weights of ``source`` are on this node.

    ``file:///abs/path`` or ``/abs/path`` -> that path, as it is (the engine reports a bad
    path in its own words); ``hf://...`` and ``https://...`` -> the first complete copy in
    ``weights_dirs`` (see :mod:`llmgw_runtime.weights.locate`). Anything else, or nothing
    complete found, raises EngineError naming the source and the directories looked in.
    """
    return resolve_weights(source, weights_dirs, check_files=False)


# Variables that choose devices; an engine gets only the ones llmgw sets.
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES",
                    "GGML_VULKAN_DEVICE", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def cuda_visible_devices(assignment: Mapping[str, Any]) -> str:
    """CUDA_VISIBLE_DEVICES for an assignment: GPU UUIDs (never indexes), ``MIG-<uuid>`` for a
    MIG instance, empty for the CPU."""
    kind = assignment.get("device_kind")
    uuids = [str(u) for u in assignment.get("device_uuids") or []]
    if kind == "cpu":
        return ""
    if kind == "gpu":
        if not uuids:
            raise EngineError(f"replica {assignment.get('replica_id')}: device_kind gpu but "
                              "no device_uuids")
        return ",".join(uuids)
    if kind == "mig":
        if len(uuids) != 1:
            raise EngineError(f"replica {assignment.get('replica_id')}: a MIG replica takes "
                              f"exactly one instance, got {len(uuids)} device_uuids")
        uuid = uuids[0]
        return uuid if uuid.startswith("MIG-") else "MIG-" + uuid
    raise EngineError(f"replica {assignment.get('replica_id')}: device_kind {kind!r} is "
                      "unknown; expected cpu, gpu or mig")


def engine_env(assignment: Mapping[str, Any]) -> dict[str, str]:
    """The environment changes every engine process gets."""
    return {"CUDA_VISIBLE_DEVICES": cuda_visible_devices(assignment)}


def assignment_args(assignment: Mapping[str, Any]) -> list[str]:
    args = assignment.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise EngineError(f"replica {assignment.get('replica_id')}: args must be a list of "
                          f"strings, got {args!r}")
    return list(args)


def profile_sizes(assignment: Mapping[str, Any]) -> tuple[int, int]:
    """(tensor parallel, pipeline parallel) sizes of the assignment's profile."""
    profile = assignment.get("profile") or {}
    return int(profile.get("tp") or 1), int(profile.get("pp") or 1)


def peers_of(assignment: Mapping[str, Any]) -> list[tuple[int, str]]:
    """(rank, address) of every part of a multi-node replica, rank order; an address the
    control service does not know yet is an error naming the node."""
    out = []
    for peer in sorted(assignment.get("peers") or [], key=lambda p: p.get("rank", 0)):
        if not peer.get("address"):
            raise EngineError(f"replica {assignment.get('replica_id')}: node "
                              f"{peer.get('node')!r} (rank {peer.get('rank')}) has no "
                              "address; set LLMGW_ADDRESS on its agent")
        out.append((int(peer["rank"]), str(peer["address"])))
    return out


def rendezvous(assignment: Mapping[str, Any]) -> int:
    port = assignment.get("rendezvous_port")
    if not isinstance(port, int):
        raise EngineError(f"replica {assignment.get('replica_id')}: a multi-node part needs "
                          "a rendezvous_port from the control service")
    return port


def has_flag(args: Sequence[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in args for f in flags)


class EngineDriver(ABC):
    """Builds the command line of one engine kind (``llama.cpp``, ``vllm``). A multi-node
    replica has a part per node: rank 0 (the head) serves HTTP, the others are workers."""

    name = "abstract"
    health_path = "/health"

    @abstractmethod
    def launch(self, assignment: Mapping[str, Any], *, host: str, port: int,
               weights_dirs: Sequence[str | Path] = ()) -> LaunchSpec:
        """The argv, environment changes and health check for ``assignment`` (a single-node
        replica, or the head of a multi-node one)."""

    @abstractmethod
    def launch_worker(self, assignment: Mapping[str, Any], *,
                      weights_dirs: Sequence[str | Path] = ()) -> LaunchSpec:
        """The same for a worker part (``role: worker``) of a multi-node replica."""

    def args_problem(self, args: Sequence[object]) -> str | None:
        """Why this engine would refuse a catalog's ``args``, or None. A driver that cannot
        say (its engine's flags vary by build) accepts anything: the engine then refuses
        at start in its own words."""
        return None

    @staticmethod
    def _executable_exists(path: str) -> bool:
        return os.path.isfile(path) and os.access(path, os.X_OK)
