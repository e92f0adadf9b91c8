"""TLS settings shared by the control service, the router, the agent and ``llmgw ctl``:
serve HTTPS with a certificate and key (LLMGW_TLS_CERT, LLMGW_TLS_KEY), and verify the
control service against the cluster CA (LLMGW_CA_FILE). ``llmgw up`` uses plain HTTP on
loopback; installs use the cluster CA made by the llmgw_tls role."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ssl


def serving_problems(cert: str, key: str) -> list[str]:
    """Problems with a certificate/key pair given to serve HTTPS ("" means not given)."""
    if not cert and not key:
        return []
    if not (cert and key):
        missing = "LLMGW_TLS_KEY" if cert else "LLMGW_TLS_CERT"
        return [f"{missing} is missing: HTTPS needs both LLMGW_TLS_CERT and LLMGW_TLS_KEY"]
    return [f"{name}={path} cannot be read; check the path and that the service's user "
            "may read it" for name, path in (("LLMGW_TLS_CERT", cert), ("LLMGW_TLS_KEY", key))
            if not os.access(path, os.R_OK)]


def ca_problems(ca_file: str) -> list[str]:
    if ca_file and not os.access(ca_file, os.R_OK):
        return [f"LLMGW_CA_FILE={ca_file} cannot be read; it should be the cluster CA "
                "(/etc/llmgw/tls/ca.crt on an install)"]
    return []


def gunicorn_options(cert: str, key: str) -> dict[str, Any]:
    """gunicorn settings that make it serve HTTPS (TLS 1.2 or newer), or nothing. The
    handshake waits for the connection's first read (:func:`lazy_handshake`)."""
    if not cert:
        return {}
    return {"certfile": cert, "keyfile": key, "ssl_context": lazy_handshake}


class LazyHandshake:
    """An SSL context whose sockets shake hands at their first read or write, not when
    wrapped: gevent's server wraps each accepted socket before the handler runs, with no
    deadline, so a client that connected and never sent a ClientHello held its connection
    (and a greenlet) for ever. The first read is the wait for a request head, which the
    server ends at the keep-alive deadline (router/http/server.py ``Waiting``)."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context

    def wrap_socket(self, sock: Any, **options: Any) -> Any:
        return self.context.wrap_socket(sock, **{**options, "do_handshake_on_connect": False})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.context, name)


def lazy_handshake(config: Any, default_context: Any) -> LazyHandshake:
    """gunicorn's ``ssl_context`` hook: its own context (certificate, key, TLS 1.2 or
    newer), shaking hands lazily."""
    return LazyHandshake(default_context())


def client_context(ca_file: str | None) -> ssl.SSLContext | None:
    """An SSL context verifying against ``ca_file``, or None for the system's defaults."""
    if not ca_file:
        return None
    import ssl  # here, not at import: the router's gevent must patch it first

    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
