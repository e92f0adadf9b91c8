"""Settings of the control service (``LLMGW_*`` environment variables or flags)."""

from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from .. import tls, tracing
from ..security import token_problem

MAX_HISTORY_DAYS = 3650        # history_days' bound: ten years of hourly points
WEB_WORKERS = ("auto", "gevent", "gthread")


def default_state_dir() -> Path:
    return Path(os.environ.get("LLMGW_STATE_DIR") or ".llmgw")


@dataclass(frozen=True)
class ControlConfig:
    state_dir: Path = Path(".llmgw")
    database_url: str = ""              # default: sqlite:///<state_dir>/llmgw.db
    host: str = "127.0.0.1"
    port: int = 8470
    workers: int = 2
    threads: int = 8                    # gthread workers' (SQLite) threads each
    # The web workers: "auto" (gevent on PostgreSQL, gthread on SQLite: control/worker.py
    # says why), "gevent" or "gthread".
    web_worker: str = "auto"
    # Connections each worker holds open: every agent and router keeps one alive, so at
    # least the number of agents (gunicorn's default, 1,000, refused the 1,001st agent).
    worker_connections: int = 5000
    # How much lower the web workers' CPU priority is than the reconciler's (nice, 0-19):
    # on a busy host a pass waits for a core behind them otherwise (docs/operations.md).
    web_nice: int = 5
    # Bootstrap secrets: when given, their hashes are stored at start. No defaults: when
    # absent and none is stored yet, the server generates one and shows it once.
    admin_token: str = ""
    join_token: str = ""
    router_token: str = ""
    instance_name: str = ""             # default: hostname:pid (gunicorn's master pid)
    reconcile_interval_s: float = 1.0
    # How long a web request waits for the store (one transaction, a connection, and the
    # retries through a failover together) before it is answered 503 with Retry-After:
    # a whole request stays under about twice this, below the routers' and agents' 10 s
    # and common 30 s client timeouts (docs/store.md, "Failover").
    store_wait_s: float = 4.0
    lease_ttl_s: float = 10.0
    node_timeout_s: float = 30.0        # silent longer: the node is not capacity
    replace_after_s: float = 120.0      # silent longer: its replicas are placed elsewhere
    rendezvous_ports: str = "29500-29999"   # where the parts of multi-node replicas meet
    report_interval_s: float = 2.0
    start_timeout_s: float = 180.0      # a replica not ready by then is a failed start
    backoff_base_s: float = 5.0         # wait after a failed start, doubling per failure...
    backoff_cap_s: float = 300.0        # ...up to this
    placement_warning_every_s: float = 600.0   # repeat an unchanged placement warning
    idle_after_s: float = 900.0         # status views: a replica unused this long is idle
    reconcile: bool = True              # false: serve the APIs only, never lead
    # The replicated store's Patroni REST APIs (http://db1:8008,http://db2:8008), for its
    # members' health in ctl status and /metrics; default: port 8008 of each host of a
    # multi-host database_url.
    patroni_urls: str = ""
    # Its etcd voters' client URLs (http://db1:2379,...,http://127.0.0.1:2379; server
    # init writes them), for each voter's health in ctl status and /metrics.
    etcd_urls: str = ""
    tls_cert: str = ""                  # serve HTTPS with this certificate and key
    tls_key: str = ""
    ca_file: str = ""                   # the cluster CA: its expiry is a metric
    # A secret, no default: when set, GET /metrics needs `Authorization: Bearer <it>`;
    # when empty /metrics is open (it carries model and node names, no secrets).
    metrics_token: str = ""
    # Web console: a login lasts this long (seconds; the cookie's max-age, 12 h), and read
    # pages reload themselves every console_refresh_s seconds (0: never).
    console_session_s: float = 43200.0
    console_refresh_s: float = 10.0
    # Where agents' reported addresses may lie besides the address their report came from
    # (comma-separated networks, e.g. 10.20.0.0/16 when agents report through a NAT or a
    # proxy). Empty: a node may only claim the address it reports from (docs/security.md).
    agent_networks: str = ""
    # The fleet's history for the console's charts (store/history.py): hourly points are
    # kept this many days (minute points two days); 0 keeps no history.
    history_days: float = 14.0
    # GPU-hours priced (control/gpu_hours.py): "CLASS=PRICE,..." per device-hour of each
    # device class (e.g. "h100-80g=2.5,cpu=0"); a class not named has no price.
    cost_per_device_hour: str = ""
    # OpenTelemetry: when set, spans of control-service requests and reconciler passes go
    # to this OTLP/HTTP endpoint (http://collector:4318); off when empty, at no cost.
    otel_endpoint: str = ""
    otel_sample_ratio: float = 1.0      # the share of traces kept (0-1), by trace id

    def validate(self) -> list[str]:
        problems = []
        if not 0 < self.port < 65536:
            problems.append(f"LLMGW_PORT={self.port} is not a TCP port (1-65535)")
        if self.workers < 1:
            problems.append("LLMGW_WORKERS must be at least 1")
        if self.web_worker not in WEB_WORKERS:
            problems.append(f"LLMGW_WEB_WORKER={self.web_worker!r}: use one of "
                            f"{', '.join(WEB_WORKERS)}")
        elif self.web_worker == "gevent" and self.store_url.startswith("sqlite"):
            problems.append("LLMGW_WEB_WORKER=gevent needs PostgreSQL: SQLite's file lock "
                            "would stall a gevent worker's every connection (use auto)")
        if self.worker_connections < 1:
            problems.append("LLMGW_WORKER_CONNECTIONS must be at least 1 (each agent and "
                            "router keeps a connection open: at least the number of agents)")
        if not 0 <= self.web_nice <= 19:
            problems.append(f"LLMGW_WEB_NICE={self.web_nice} must be a nice value from 0 "
                            "(the reconciler's priority) to 19")
        if not 0 < self.store_wait_s <= 60:
            problems.append(f"LLMGW_STORE_WAIT_S={self.store_wait_s:g} must be above 0 and at "
                            "most 60 seconds (keep twice it below your clients' timeouts)")
        if self.lease_ttl_s <= self.reconcile_interval_s * 2:
            problems.append("LLMGW_LEASE_TTL_S must be more than twice "
                            "LLMGW_RECONCILE_INTERVAL_S, or leadership flaps")
        if not 0 < self.backoff_base_s <= self.backoff_cap_s:
            problems.append("LLMGW_BACKOFF_BASE_S must be above 0 and at most "
                            "LLMGW_BACKOFF_CAP_S")
        if self.replace_after_s < self.node_timeout_s:
            problems.append(f"LLMGW_REPLACE_AFTER_S ({self.replace_after_s:g}) must be at least "
                            f"LLMGW_NODE_TIMEOUT_S ({self.node_timeout_s:g})")
        try:
            _ = self.rendezvous_range
        except ValueError as exc:
            problems.append(f"LLMGW_RENDEZVOUS_PORTS={self.rendezvous_ports!r}: {exc}")
        try:
            _ = self.agent_network_list
        except ValueError as exc:
            problems.append(f"LLMGW_AGENT_NETWORKS={self.agent_networks!r}: {exc}")
        if not 0 <= self.history_days <= MAX_HISTORY_DAYS:   # NaN too
            problems.append(f"LLMGW_HISTORY_DAYS={self.history_days:g} must be from 0 (keep no "
                            f"history) to {MAX_HISTORY_DAYS} days of the fleet's hourly "
                            "points (default 14)")
        try:
            from .gpu_hours import parse_costs

            parse_costs(self.cost_per_device_hour)
        except ValueError as exc:
            problems.append(f"LLMGW_COST_PER_DEVICE_HOUR={self.cost_per_device_hour[:80]!r}: "
                            f"{exc}")
        problems += [p for p in (token_problem(f"LLMGW_{name.upper()}", getattr(self, name))
                                 for name in ("admin_token", "join_token", "router_token"))
                     if p]
        problems += tracing.problems(self.otel_endpoint, self.otel_sample_ratio)
        problems += tls.serving_problems(self.tls_cert, self.tls_key)
        problems += tls.ca_problems(self.ca_file)
        url = self.database_url
        if url and not url.startswith(("sqlite:", "postgresql:", "postgres:",
                                       "postgresql+psycopg2:")):
            problems.append("LLMGW_DATABASE_URL must start with sqlite:/// or postgresql://")
        return problems

    @property
    def backoff(self) -> tuple[float, float]:
        return self.backoff_base_s, self.backoff_cap_s

    @property
    def rendezvous_range(self) -> range:
        """The rendezvous port range, ``FIRST-LAST`` inclusive."""
        first, sep, last = self.rendezvous_ports.partition("-")
        if not sep or not first.strip().isdigit() or not last.strip().isdigit():
            raise ValueError("write the range as FIRST-LAST, e.g. 29500-29999")
        lo, hi = int(first), int(last)
        if not 1024 <= lo <= hi < 65536:
            raise ValueError("ports must be between 1024 and 65535, first <= last")
        return range(lo, hi + 1)

    @property
    def agent_network_list(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """The networks of LLMGW_AGENT_NETWORKS; ValueError naming a bad one."""
        out = []
        for item in filter(None, (x.strip() for x in self.agent_networks.split(","))):
            try:
                out.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                raise ValueError(f"{item!r} is not a network; write e.g. 10.20.0.0/16") \
                    from None
        return tuple(out)

    @property
    def store_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.state_dir / 'llmgw.db').resolve()}"

    @property
    def store_members_urls(self) -> list[str]:
        from ..store.members import patroni_urls

        return patroni_urls(self.patroni_urls, self.store_url)

    @property
    def store_etcd_urls(self) -> list[str]:
        from ..store.members import etcd_urls

        return etcd_urls(self.etcd_urls)

    @property
    def gevent_web(self) -> bool:
        """Whether the web workers are gevent ones (control/worker.py)."""
        if self.web_worker == "auto":
            return not self.store_url.startswith("sqlite")
        return self.web_worker == "gevent"

    @property
    def instance(self) -> str:
        """This control service across its gunicorn workers: ``instance_name``, or
        ``hostname:pid`` of the gunicorn master (of this process outside gunicorn)."""
        if self.instance_name:
            return self.instance_name
        under_gunicorn = os.environ.get("SERVER_SOFTWARE", "").startswith("gunicorn/")
        return f"{socket.gethostname()}:{os.getppid() if under_gunicorn else os.getpid()}"

    @property
    def holder(self) -> str:
        """This worker's lease holder prefix, ``<instance>:<pid>``; the reconciler appends
        ``:<random>``, so :func:`instance_of_holder` finds the instance again."""
        return f"{self.instance}:{os.getpid()}"


def instance_of_holder(holder: str) -> str:
    """The control instance of a lease holder ``<instance>:<pid>:<random>``."""
    return holder.rsplit(":", 2)[0]
