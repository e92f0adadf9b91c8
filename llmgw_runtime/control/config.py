"""Settings of the control service (``LLMGW_*`` environment variables or flags)."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from .. import tls


def default_state_dir() -> Path:
    return Path(os.environ.get("LLMGW_STATE_DIR") or ".llmgw")


@dataclass(frozen=True)
class ControlConfig:
    state_dir: Path = Path(".llmgw")
    database_url: str = ""              # default: sqlite:///<state_dir>/llmgw.db
    host: str = "127.0.0.1"
    port: int = 8470
    workers: int = 2
    threads: int = 8
    # Bootstrap secrets: when given, their hashes are stored at start. No defaults: when
    # absent and none is stored yet, the server generates one and shows it once.
    admin_token: str = ""
    join_token: str = ""
    router_token: str = ""
    instance_name: str = ""             # default: hostname:pid
    reconcile_interval_s: float = 1.0
    lease_ttl_s: float = 10.0
    node_timeout_s: float = 30.0
    report_interval_s: float = 2.0
    start_timeout_s: float = 180.0      # a replica not ready by then is a failed start
    reconcile: bool = True              # false: serve the APIs only, never lead
    tls_cert: str = ""                  # serve HTTPS with this certificate and key
    tls_key: str = ""

    def validate(self) -> list[str]:
        problems = []
        if not 0 < self.port < 65536:
            problems.append(f"LLMGW_PORT={self.port} is not a TCP port (1-65535)")
        if self.workers < 1:
            problems.append("LLMGW_WORKERS must be at least 1")
        if self.lease_ttl_s <= self.reconcile_interval_s * 2:
            problems.append("LLMGW_LEASE_TTL_S must be more than twice "
                            "LLMGW_RECONCILE_INTERVAL_S, or leadership flaps")
        problems += tls.serving_problems(self.tls_cert, self.tls_key)
        url = self.database_url
        if url and not url.startswith(("sqlite:", "postgresql:", "postgres:",
                                       "postgresql+psycopg2:")):
            problems.append("LLMGW_DATABASE_URL must start with sqlite:/// or postgresql://")
        return problems

    @property
    def store_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.state_dir / 'llmgw.db').resolve()}"

    @property
    def holder(self) -> str:
        return self.instance_name or f"{socket.gethostname()}:{os.getpid()}"
