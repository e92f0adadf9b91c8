"""Serving the router with gunicorn gevent workers, programmatically.

gunicorn's gevent worker patches the standard library before it loads the app, and
:meth:`_RouterApplication.load` imports the app only then, in the worker: pools, threads
and the routes loop are all made after patching. SIGTERM stops gracefully (in-flight
requests get ``graceful_timeout``), SIGINT/SIGQUIT at once (gunicorn's own handling).
"""

from __future__ import annotations

import logging
from typing import Any

from gunicorn.app.base import BaseApplication

from .. import tls
from .config import RouterConfig

GRACEFUL_TIMEOUT_S = 30


def gunicorn_options(config: RouterConfig) -> dict[str, Any]:
    host = f"[{config.host}]" if ":" in config.host else config.host
    return {
        "bind": [f"{host}:{config.port}"],
        "workers": config.workers,
        "worker_class": "gevent",
        "worker_connections": config.worker_connections,
        "graceful_timeout": GRACEFUL_TIMEOUT_S,
        "keepalive": 5,
        # gunicorn 27 opens a control socket at one fixed path: several routers on one
        # machine (tests, `llmgw up`) would collide.
        "control_socket_disable": True,
        "proc_name": "llmgw-router",
        "accesslog": None,
        "loglevel": "info",
        **tls.gunicorn_options(config.tls_cert, config.tls_key),
    }


class _RouterApplication(BaseApplication):  # type: ignore[misc]
    def __init__(self, config: RouterConfig) -> None:
        self._config = config
        super().__init__()

    def load_config(self) -> None:
        for key, value in gunicorn_options(self._config).items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Any:
        from .app import create_app  # imported in the worker, after gevent patched

        return create_app(self._config)


def run(config: RouterConfig) -> None:
    """Serve the router until SIGTERM/SIGINT; blocks."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s")
    _RouterApplication(config).run()
