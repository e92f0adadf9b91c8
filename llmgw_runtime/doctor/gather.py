"""Gathering the doctor's facts on a node: the thin shell around ``diagnose``."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from .. import tls
from ..agent.config import AgentConfig
from ..devices.model import Discovery
from ..devices.sources import DeviceSource, source_from_spec
from ..engines.drivers import engine_problems
from ..engines.llamacpp_build import LlamaCppBuild, cpu_engine, inspect
from ..errors import LlmgwError
from .diagnose import GPU_SPECS, Facts, WeightsDir
from .local import LocalSettings
from .relay_loop import inspect as inspect_relay


def engines(config: AgentConfig) -> dict[str, str | None]:
    """Each engine the agent would offer, with a problem or None."""
    return engine_problems(config.llama_server_binary, config.vllm_python)


def llama_cpp(config: AgentConfig) -> LlamaCppBuild | None:
    """The llama.cpp build the agent would run: its llama-server, else the CPU engine."""
    if config.llama_server_binary:
        return inspect(config.llama_server_binary, config.llama_rpc_binary)
    return cpu_engine()


def weights(dirs: tuple[str, ...]) -> list[WeightsDir]:
    out = []
    for raw in dirs:
        path = Path(raw)
        if not path.is_dir():
            out.append(WeightsDir(raw, exists=False))
            continue
        readable = os.access(path, os.R_OK | os.X_OK)
        entries = len(list(path.iterdir())) if readable else 0
        out.append(WeightsDir(raw, exists=True, readable=readable, entries=entries))
    return out


def control(url: str, timeout: float = 3.0, ca_file: str = "") -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/healthz", timeout=timeout,
                                    context=tls.client_context(ca_file)) as resp:
            body = json.loads(resp.read() or b"{}")
            return True, str(body.get("status", "ok"))
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, str(reason)


def _look(source: DeviceSource | None) -> Discovery | None:
    if source is None:
        return None
    try:
        return source.discover()
    except LlmgwError as exc:
        return Discovery(problems=[str(exc)], source=source.name)


def _look_other(spec: str) -> tuple[Discovery, str | None]:
    """A cpu, fake or none source's discovery, and its failure when it could not look at
    all (a fake file that cannot be read, /proc/meminfo unreadable), in its own words."""
    try:
        found = source_from_spec(spec).discover()
    except LlmgwError as exc:
        return Discovery(problems=[]), str(exc)
    if spec.partition(":")[0] == "cpu" and not found.devices and found.problems:
        return Discovery(), "; ".join(found.problems)
    return found, None


def gather(config: AgentConfig, *, nvml: DeviceSource | None = None,
           nvidia_smi: DeviceSource | None = None, check_control: bool = True,
           local: LocalSettings | None = None) -> Facts:
    """Everything the doctor judges. GPU sources default to the real ones when the agent's
    device source is a GPU one; tests hand in sources fed with fakes or captured output.
    ``local`` says whose settings ``config`` holds (doctor/local.py)."""
    spec = config.devices.partition(":")[0]
    other, failed = None, None
    if spec in GPU_SPECS:
        if nvml is None and spec in ("auto", "nvml"):
            nvml = source_from_spec("nvml")
        if nvidia_smi is None and spec in ("auto", "nvidia-smi"):
            nvidia_smi = source_from_spec("nvidia-smi")
    else:
        other, failed = _look_other(config.devices)
    ok, detail = (None, None)
    if check_control and config.control_url:
        ok, detail = control(config.control_url, ca_file=config.ca_file)
    return Facts(devices_spec=spec, nvml=_look(nvml), nvidia_smi=_look(nvidia_smi),
                 other=other, other_failed=failed, devices=config.devices,
                 settings_from=local.describe() if local is not None else None,
                 settings_problem=local.problem if local is not None else None,
                 engines=engines(config), llama_cpp=llama_cpp(config), weights=weights(config.weights_dirs),
                 control_url=config.control_url or None, control_ok=ok,
                 control_detail=detail, relay=inspect_relay())
