"""What every engine driver does: turn an assignment into a command line and environment."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from ..errors import EngineError


@dataclass(frozen=True)
class LaunchSpec:
    """How to start one engine process and how to tell it is healthy."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"


def resolve_source(source: str, weights_dirs: Sequence[str | Path] = ()) -> Path:
    """Where the weights of ``source`` are on this node.

    ``file:///abs/path`` or ``/abs/path`` -> that path; ``hf://org/repo/file.gguf`` -> the
    file of that name in one of ``weights_dirs``. Anything else raises EngineError.
    """
    if source.startswith("file://"):
        parsed = urlparse(source)
        path = unquote(parsed.path)
        if parsed.netloc not in ("", "localhost") or not path.startswith("/"):
            raise EngineError(f"source {source!r} is not an absolute file URL; "
                              "write file:///absolute/path/model.gguf")
        return Path(path)
    if source.startswith("/"):
        return Path(source)
    if source.startswith("hf://"):
        rest = source[len("hf://"):].strip("/")
        parts = rest.split("/")
        if len(parts) < 3 or not all(parts):
            raise EngineError(f"source {source!r} must be hf://org/repo/file (e.g. "
                              "hf://Qwen/Qwen2.5-7B-Instruct-GGUF/qwen2.5-7b-instruct-q4_k_m.gguf)")
        relative = "/".join(parts[2:])
        name = parts[-1]
        for d in weights_dirs:
            base = Path(d).expanduser()
            for candidate in (base / relative, base / name, base / parts[0] / parts[1] / relative):
                if candidate.exists():
                    return candidate
        looked = ", ".join(str(d) for d in weights_dirs) or "no directories (none configured)"
        raise EngineError(
            f"source {source!r}: {name} was not found in the weights directories "
            f"({looked}); download it into one of them, or set LLMGW_WEIGHTS_DIRS to the "
            "directory that holds it")
    raise EngineError(f"source {source!r} is not supported on this node; use "
                      "file:///absolute/path, an absolute path, or hf://org/repo/file "
                      "with the file in a weights directory")


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


class EngineDriver(ABC):
    """Builds the command line of one engine kind (``llama.cpp``, ``vllm``)."""

    name = "abstract"
    health_path = "/health"

    @abstractmethod
    def launch(self, assignment: Mapping[str, Any], *, host: str, port: int,
               weights_dirs: Sequence[str | Path] = ()) -> LaunchSpec:
        """The argv, environment changes and health path for ``assignment``."""

    @staticmethod
    def _executable_exists(path: str) -> bool:
        return os.path.isfile(path) and os.access(path, os.X_OK)
