"""Serve the control service with gunicorn (gthread workers); each worker runs a
reconciler, and the leader lease lets only one of them act."""

from __future__ import annotations

import logging
from typing import Any

from gunicorn.app.base import BaseApplication

from .. import tls
from ..store import Store
from .app import create_app
from .bootstrap import bootstrap
from .config import ControlConfig

log = logging.getLogger(__name__)


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, config: ControlConfig) -> None:
        self.llmgw_config = config
        super().__init__()

    def load_config(self) -> None:
        cfg = self.llmgw_config
        for key, value in {
            "bind": f"{cfg.host}:{cfg.port}",
            "workers": cfg.workers,
            "threads": cfg.threads,
            "worker_class": "gthread",
            "timeout": 60,
            # Agents report every few seconds and routers poll every second over kept-alive
            # connections: a short server keep-alive races their reuse (RemoteDisconnected).
            "keepalive": 75,
            "graceful_timeout": 10,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "info",
            "proc_name": "llmgw-control",
        }.items():
            self.cfg.set(key, value)
        for key, value in tls.gunicorn_options(cfg.tls_cert, cfg.tls_key).items():
            self.cfg.set(key, value)
        if "control_socket_disable" in self.cfg.settings:
            self.cfg.set("control_socket_disable", True)

    def load(self) -> Any:
        return create_app(self.llmgw_config, start_reconciler=True)


def run(config: ControlConfig) -> None:
    store = Store(config.store_url)
    bootstrap(store, config)
    store.dispose()
    _Gunicorn(config).run()
