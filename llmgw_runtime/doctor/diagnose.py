"""The doctor's judgement: a pure function from what was found on the node to findings,
each with a level and, for anything wrong, what to do. Exit code 0 / 1 / 2; a node with no
usable device (no driver, a device source that finds nothing or cannot look) is 2."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..devices.model import Discovery
from ..engines.llamacpp_build import BUILD_HINT, RPC_SERVER_NAMES, LlamaCppBuild
from .relay_loop import FIX as RELAY_FIX
from .relay_loop import REBUILD as RELAY_REBUILD
from .relay_loop import RelayLoop

OK, WARNING, ERROR = "ok", "warning", "error"
GPU_SPECS = ("auto", "nvml", "nvidia-smi")


@dataclass(frozen=True)
class WeightsDir:
    path: str
    exists: bool
    readable: bool = False
    entries: int = 0


@dataclass(frozen=True)
class Facts:
    devices_spec: str                       # what the agent is told to use: auto, nvml, cpu...
    nvml: Discovery | None = None           # None: not looked at
    nvidia_smi: Discovery | None = None
    other: Discovery | None = None          # cpu / fake / none when that is the spec
    other_failed: str | None = None         # that source could not look at all (its words)
    devices: str = ""                       # the whole --devices value (fake:/path/file)
    settings_from: str | None = None        # whose settings are checked (doctor/local.py)
    settings_problem: str | None = None     # the agent's env file exists but is unreadable
    engines: dict[str, str | None] = field(default_factory=dict)  # name -> problem or None
    llama_cpp: LlamaCppBuild | None = None  # the llama.cpp build the agent would run
    weights: list[WeightsDir] = field(default_factory=list)
    control_url: str | None = None
    control_ok: bool | None = None
    control_detail: str | None = None
    relay: RelayLoop | None = None          # the router's relay loop; None: not looked at


@dataclass(frozen=True)
class Finding:
    level: str
    topic: str
    message: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _source_failed(found: Discovery | None) -> str | None:
    """The source's own failure when it saw no card at all, else None."""
    if found is None or found.cards or found.devices:
        return None
    return "; ".join(found.problems) or "it found no GPU"


def _drivers(facts: Facts) -> list[Finding]:
    out: list[Finding] = []
    nvml_err, smi_err = _source_failed(facts.nvml), _source_failed(facts.nvidia_smi)
    for name, found, err in (("NVML", facts.nvml, nvml_err),
                             ("nvidia-smi", facts.nvidia_smi, smi_err)):
        if found is None:
            continue
        if err is None:
            version = f" (driver {found.driver_version})" if found.driver_version else ""
            out.append(Finding(OK, "driver", f"{name} works{version}: "
                               f"{len(found.cards)} card(s), {len(found.devices)} device(s)"))
        else:
            out.append(Finding(WARNING, "driver", f"{name} is not usable: {err}"))
    tried = [f for f in (facts.nvml, facts.nvidia_smi) if f is not None]
    if tried and all(_source_failed(f) for f in tried):
        out.append(Finding(ERROR, "driver", "no NVIDIA driver answers on this node: no GPU "
                           "can run anything",
                           "install the NVIDIA driver and load it (nvidia-smi must list the "
                           "cards), or run the agent with --devices cpu on a machine without "
                           "GPUs"))
    if facts.nvml and facts.nvidia_smi and not nvml_err and not smi_err:
        a = {d.uuid: d for d in facts.nvml.devices}
        b = {d.uuid: d for d in facts.nvidia_smi.devices}
        if set(a) != set(b):
            only_a = ", ".join(sorted(set(a) - set(b))) or "none"
            only_b = ", ".join(sorted(set(b) - set(a))) or "none"
            out.append(Finding(WARNING, "driver", "NVML and nvidia-smi disagree about the "
                               f"devices: only NVML sees {only_a}; only nvidia-smi sees "
                               f"{only_b}",
                               "a MIG change may be in progress; run the doctor again, and "
                               "reset the GPU if it persists"))
    return out


def _cards(found: Discovery) -> list[Finding]:
    out = []
    for card in found.cards:
        if card.mig_current is None:
            mig = "MIG not supported"
        else:
            mig = (f"MIG {'enabled' if card.mig_current else 'disabled'}"
                   + ("" if card.mig_pending == card.mig_current else
                      f" (pending: {'enabled' if card.mig_pending else 'disabled'})"))
            if card.mig_current:
                mig += f", {card.instances} instance(s)"
        where = f"card {card.index} ({card.name})"
        if card.problem:
            out.append(Finding(WARNING, "mig", f"{where} can run nothing: {card.problem}",
                               card.hint))
        else:
            out.append(Finding(OK, "mig", f"{where}: {mig}, class {card.klass}"))
    for dev in found.devices:
        if not dev.healthy:
            out.append(Finding(WARNING, "health", f"device {dev.label} ({dev.klass}) is "
                               f"unhealthy and will not be used: {dev.reason}",
                               "see the reason; after a fix, reset the GPU (nvidia-smi -r)"))
    if found.cards and not any(d.healthy for d in found.devices):
        out.append(Finding(ERROR, "devices", "no card on this node can run anything",
                           "fix the cards above: each says what to do"))
    return out


def _rest(facts: Facts) -> list[Finding]:
    out = []
    if not facts.engines:
        out.append(Finding(ERROR, "engines", "no inference engine is installed",
                           "install llama.cpp's llama-server (set LLMGW_LLAMA_SERVER_BINARY) "
                           "or xllamacpp, or vLLM (set LLMGW_VLLM_PYTHON)"))
    for name, problem in sorted(facts.engines.items()):
        if problem:
            out.append(Finding(ERROR, "engines", f"engine {name}: {problem}"))
        else:
            out.append(Finding(OK, "engines", f"engine {name} is installed"))
    if facts.llama_cpp is not None and not facts.engines.get("llama.cpp"):
        out += _llama_cpp(facts.llama_cpp)
    if not facts.weights:
        out.append(Finding(OK, "weights", "no weights directories configured: models are "
                           "read from their source paths"))
    for w in facts.weights:
        if not w.exists:
            out.append(Finding(WARNING, "weights", f"weights directory {w.path} does not exist",
                               "create or mount it, or remove it from LLMGW_WEIGHTS_DIRS"))
        elif not w.readable:
            out.append(Finding(WARNING, "weights", f"weights directory {w.path} is not "
                               "readable by this user", "fix its permissions"))
        elif not w.entries:
            out.append(Finding(WARNING, "weights", f"weights directory {w.path} is empty "
                               "(an empty directory is not weights)",
                               "copy or mount the model files there"))
        else:
            out.append(Finding(OK, "weights", f"weights directory {w.path} holds "
                               f"{w.entries} entries"))
    if facts.control_url is None:
        out.append(Finding(WARNING, "control", "no control service configured",
                           "set LLMGW_CONTROL_URL (or --control-url)"))
    elif facts.control_ok is None:
        pass                                # not checked
    elif facts.control_ok:
        out.append(Finding(OK, "control", f"control service {facts.control_url} answers"))
    else:
        out.append(Finding(ERROR, "control", f"control service {facts.control_url} cannot "
                           f"be reached: {facts.control_detail}",
                           "check the URL, that `llmgw server` runs there, and the firewall"))
    return out


def _llama_cpp(build: LlamaCppBuild) -> list[Finding]:
    """Which llama.cpp build this node runs: version, source, RPC support and worker."""
    if build.problem:
        return [Finding(ERROR, "llama.cpp", build.describe(),
                        "run it by hand to see why; a build whose shared libraries are "
                        f"not beside it cannot start ({BUILD_HINT})")]
    if build.rpc and not build.rpc_server:
        return [Finding(WARNING, "llama.cpp", build.describe(),
                        f"put llama.cpp's RPC worker ({' or '.join(RPC_SERVER_NAMES)}) next "
                        "to llama-server or set LLMGW_LLAMA_RPC_BINARY; "
                        f"{BUILD_HINT} builds both")]
    return [Finding(OK, "llama.cpp", build.describe())]


def diagnose(facts: Facts) -> list[Finding]:
    findings: list[Finding] = []
    if facts.devices_spec in GPU_SPECS:
        findings += _drivers(facts)
        usable = next((f for f in (facts.nvml, facts.nvidia_smi)
                       if f is not None and not _source_failed(f)), None)
        if usable is not None:
            findings += _cards(usable)
    elif facts.other is not None:
        findings += _other(facts, facts.other)
    return _settings(facts) + findings + _rest(facts) + _relay(facts.relay)


def _relay(relay: RelayLoop | None) -> list[Finding]:
    """Which relay loop a router on this node runs: compiled, or the interpreted fallback."""
    if relay is None:
        return []
    line = f"router relay loop: {relay.describe()}"
    if relay.problem:
        return [Finding(ERROR, "router", line, "set LLMGW_ROUTER_RELAY to auto, compiled or "
                        f"interpreted; for the compiled one, {RELAY_FIX}")]
    if relay.stale:
        return [Finding(WARNING, "router", line, RELAY_REBUILD)]
    if relay.kind == "interpreted" and not relay.chosen:
        return [Finding(WARNING, "router", line, RELAY_FIX)]
    return [Finding(OK, "router", line)]


def _settings(facts: Facts) -> list[Finding]:
    out = []
    if facts.settings_from:
        out.append(Finding(OK, "settings", f"{facts.settings_from}: devices "
                           f"{facts.devices or facts.devices_spec}, control service "
                           f"{facts.control_url or '(none)'}"))
    if facts.settings_problem:
        out.append(Finding(WARNING, "settings", facts.settings_problem,
                           "run the doctor as the agent's user or root (sudo -u llmgw llmgw "
                           "doctor), or name a readable file with --env-file"))
    return out


def _other(facts: Facts, found: Discovery) -> list[Finding]:
    """A non-GPU source (cpu, fake, none). No device at all is an error: the node can run
    no model (exit code 2), whichever source said so."""
    spec = facts.devices or facts.devices_spec
    if facts.other_failed:
        fix = ("check the file named after fake: (--devices or LLMGW_DEVICES); it lists the "
               "devices as YAML or JSON" if facts.devices_spec == "fake" else
               "fix what it says, or choose another device source with --devices")
        return [Finding(ERROR, "devices", f"device source {spec} cannot be used: "
                        f"{facts.other_failed}", fix)]
    out = []
    healthy = [d for d in found.devices if d.healthy]
    if not found.devices:
        fix = ("--devices none means a node that only reports; use auto for GPUs or cpu for "
               "the CPU" if facts.devices_spec == "none" else
               "list at least one device in the file" if facts.devices_spec == "fake" else
               "see the problems above")
        out.append(Finding(ERROR, "devices", f"device source {spec} found no device: this "
                           "node can run no model", fix))
    else:
        kinds = ", ".join(sorted({d.klass for d in found.devices}))
        out.append(Finding(OK if healthy else ERROR, "devices",
                           f"device source {spec}: {len(found.devices)} device(s) ({kinds})"
                           + ("" if healthy else ", none of them healthy: this node can run "
                              "no model"),
                           None if healthy else "see each device's reason (llmgw ctl nodes)"))
    for problem in found.problems:
        out.insert(0, Finding(WARNING, "devices", problem))
    return out


def exit_code(findings: list[Finding]) -> int:
    levels = {f.level for f in findings}
    return 2 if ERROR in levels else 1 if WARNING in levels else 0
