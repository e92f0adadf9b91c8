"""The agent's typed configuration: defaults, then ``LLMGW_*`` variables, then flags."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import settings, tls
from ..devices import SOURCES
from ..security import private_dir, token_problem


def _default_state_dir() -> Path:
    return Path.home() / ".llmgw-agent"


@dataclass(frozen=True)
class AgentConfig:
    """Settings of ``llmgw agent``. ``control_url`` and ``join_token`` are required (the
    token has no usable default; validate() reports it missing)."""

    control_url: str = ""
    join_token: str = field(default="", repr=False)
    node_name: str = field(default_factory=socket.gethostname)
    address: str = "127.0.0.1"
    engine_host: str = "127.0.0.1"
    state_dir: Path = field(default_factory=_default_state_dir)
    devices: str = "auto"
    llama_server_binary: str | None = None
    llama_rpc_binary: str | None = None   # llama.cpp's RPC worker (ggml-rpc-server), multi-node
    vllm_python: str | None = None
    # Where to look for weights (and download them to: the first writable one). Told
    # nothing, the agent reports no weights and downloads into <state_dir>/weights.
    weights_dirs: tuple[str, ...] = ()
    hf_token: str = field(default="", repr=False)   # for hf:// sources; never logged
    weights_scan_interval_s: float = 30.0   # how often the weights dirs are looked at
    report_interval_s: float = 2.0
    start_timeout_s: float = 120.0
    stop_engines_on_exit: bool = False
    fabric: str | None = None
    ca_file: str = ""          # the CA that signed the control service's certificate

    def validate(self) -> list[str]:
        problems: list[str] = []
        if not self.control_url:
            problems.append("control_url is required; set LLMGW_CONTROL_URL "
                            "(e.g. http://127.0.0.1:8470)")
        elif not self.control_url.startswith(("http://", "https://")):
            problems.append(f"control_url {self.control_url!r} must start with http:// or "
                            "https://")
        if not self.join_token:
            problems.append("join_token is required; set LLMGW_JOIN_TOKEN to the cluster's "
                            "join token (llmgw-join-...)")
        problems += filter(None, [token_problem("LLMGW_JOIN_TOKEN", self.join_token)])
        if not self.node_name.strip():
            problems.append("node_name must not be empty")
        kind = self.devices.partition(":")[0]
        if kind not in SOURCES:
            problems.append(f"devices {self.devices!r} is unknown; use "
                            + ", ".join(sorted(SOURCES)) + " (fake:/path/file.yaml)")
        elif kind == "fake" and not self.devices.partition(":")[2]:
            problems.append("devices 'fake:' names no file; use fake:/path/file.yaml")
        problems += tls.ca_problems(self.ca_file)
        if self.report_interval_s <= 0:
            problems.append(f"report_interval_s must be > 0, got {self.report_interval_s}")
        if self.start_timeout_s <= 0:
            problems.append(f"start_timeout_s must be > 0, got {self.start_timeout_s}")
        return problems

    @property
    def run_dir(self) -> Path:
        """Where engine records and logs live."""
        return Path(self.state_dir).expanduser() / "run"

    @property
    def fetch_dir(self) -> Path:
        """Where weights are downloaded when no weights_dirs are configured."""
        return Path(self.state_dir).expanduser() / "weights"

    @property
    def credential_path(self) -> Path:
        return Path(self.state_dir).expanduser() / "credential"

    def prepare_state_dir(self) -> Path:
        """The state directory for this user only (it holds the node credential, engine
        records and logs, downloaded weights): a new one is 0700; an existing one open to
        others or writable by its group becomes 0700, a group-read one (0750, as the
        Ansible role makes it) is kept."""
        return private_dir(Path(self.state_dir))


def load_config(**explicit: Any) -> AgentConfig:
    """Build and validate the config; ConfigError lists every problem."""
    return settings.load(AgentConfig, **explicit)
