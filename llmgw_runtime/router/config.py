"""The router's typed configuration, loaded with ``llmgw_runtime.settings.load``.

Environment overrides use ``LLMGW_<FIELD>`` (``LLMGW_CONTROL_URL``, ``LLMGW_ROUTER_TOKEN``...).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from .. import tls, tracing
from ..security import token_problem
from .cors import parse_origins
from .tables.slots import parse_share


@dataclass(frozen=True)
class RouterConfig:
    """Settings of one router instance. ``control_url`` and ``router_token`` are required."""

    control_url: str = ""
    router_token: str = ""  # a secret: no default, validate() insists on one
    host: str = "127.0.0.1"
    port: int = 8480
    workers: int = 2
    worker_connections: int = 2000
    require_api_key: bool = True
    refresh_interval_s: float = 1.0
    activation_timeout_s: float = 120.0
    # LLMGW_UPSTREAM_TIMEOUT_S: the most an engine may stay silent in one wait (for its
    # answer's head, or between two pieces of its body); restarted on every byte.
    upstream_timeout_s: float = 600.0
    # LLMGW_MAX_BUFFERED_ANSWER_MB: a whole (non-streamed) answer larger than this is passed
    # through to the client as it arrives instead of being read whole first.
    max_buffered_answer_mb: float = 8.0
    max_body_mb: float = 16.0  # LLMGW_MAX_BODY_MB: larger request bodies get a 413 unread
    tls_cert: str = ""        # serve HTTPS with this certificate and key
    tls_key: str = ""
    ca_file: str = ""         # the CA that signed the control service's certificate
    # LLMGW_SLOT_SHARE "I/N": this router is router I of N in front of the same replicas
    # and takes its share of each replica's slots (docs/routing.md).
    slot_share: str = "1/1"
    # LLMGW_CORS_ORIGINS: the web pages (origins, comma separated, or "*" for any) whose
    # scripts may call the router from a browser (cors.py); none by default.
    cors_origins: str = ""
    # LLMGW_OTEL_ENDPOINT: when set, spans of each proxied request go to this OTLP/HTTP
    # receiver (http://collector:4318; router/tracing.py); off when empty, at no cost.
    otel_endpoint: str = ""
    # LLMGW_OTEL_SAMPLE_RATIO: the share of traces kept (0-1), by trace id; a client's
    # traceparent keeps its own decision.
    otel_sample_ratio: float = 1.0

    @property
    def cors_origin_set(self) -> frozenset[str]:
        """The origins of ``cors_origins``; none when it is malformed (validate() says so)."""
        try:
            return parse_origins(self.cors_origins)
        except ValueError:
            return frozenset()

    @property
    def slot_share_parts(self) -> tuple[int, int]:
        """(I, N) of ``slot_share``; (1, 1) when it is malformed (validate() says so)."""
        try:
            return parse_share(self.slot_share)
        except ValueError:
            return 1, 1

    @property
    def max_buffered_answer_bytes(self) -> int:
        return int(self.max_buffered_answer_mb * 1024 * 1024)

    @property
    def max_body_bytes(self) -> int:
        """The largest request body the router reads, in bytes."""
        return int(self.max_body_mb * 1024 * 1024)

    def validate(self) -> list[str]:
        """Every problem of this configuration, as messages that say what to fix."""
        problems: list[str] = []
        if not self.control_url:
            problems.append("control_url is required: set LLMGW_CONTROL_URL or --control-url "
                            "(e.g. http://127.0.0.1:8470)")
        else:
            parts = urlsplit(self.control_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                problems.append(f"control_url {self.control_url!r} is not an http(s) URL; "
                                "use e.g. http://127.0.0.1:8470")
        if not self.router_token:
            problems.append("router_token is required: set LLMGW_ROUTER_TOKEN to the cluster's "
                            "router token (llmgw-router-...)")
        problems += filter(None, [token_problem("LLMGW_ROUTER_TOKEN", self.router_token)])
        if not 0 <= self.port <= 65535:
            problems.append(f"port {self.port} is out of range; use 1-65535 (0 picks a free one)")
        if self.workers < 1:
            problems.append(f"workers {self.workers} must be at least 1")
        if self.worker_connections < 1:
            problems.append(f"worker_connections {self.worker_connections} must be at least 1")
        for name in ("refresh_interval_s", "activation_timeout_s", "upstream_timeout_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name} {getattr(self, name)} must be a positive number of seconds")
        if not 0 < self.max_body_mb <= 4096:
            problems.append(f"max_body_mb {self.max_body_mb:g} must be above 0 and at most 4096 "
                            "(MiB of one request body; default 16)")
        if not 0 < self.max_buffered_answer_mb <= 1024:
            problems.append(f"max_buffered_answer_mb {self.max_buffered_answer_mb:g} must be "
                            "above 0 and at most 1024 (MiB of one engine answer read whole "
                            "before it is sent on; default 8)")
        try:
            parse_share(self.slot_share)
        except ValueError as exc:
            problems.append(f"{exc}; set LLMGW_SLOT_SHARE")
        try:
            parse_origins(self.cors_origins)
        except ValueError as exc:
            problems.append(f"{exc}; set LLMGW_CORS_ORIGINS")
        problems += tracing.problems(self.otel_endpoint, self.otel_sample_ratio)
        problems += tls.serving_problems(self.tls_cert, self.tls_key)
        problems += tls.ca_problems(self.ca_file)
        return problems
