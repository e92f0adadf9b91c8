"""Serve the control service: gunicorn answers the APIs and the console (gevent workers
with the router's HTTP/1.1 loop on PostgreSQL, gthread workers on SQLite:
``control/worker.py``), and one reconciler process per control host decides (the leader
lease lets only one host's reconciler act). The web workers never run a reconcile pass."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import threading
import time
from typing import Any

from gunicorn.app.base import BaseApplication

from .. import gckeeper, tls, tracing
from ..store import Store
from .app import create_app
from .bootstrap import bootstrap
from .config import ControlConfig
from .reconcile import start_process

log = logging.getLogger(__name__)
WORKER = "llmgw_runtime.control.worker.ControlWorker"


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
            "worker_connections": cfg.worker_connections,
            "worker_class": (WORKER if cfg.gevent_web else "gthread"),
            "timeout": 60,
            # Agents report every few seconds and routers poll every second over kept-alive
            # connections: a short server keep-alive races their reuse (RemoteDisconnected).
            "keepalive": 75,
            "graceful_timeout": 10,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "info",
            "proc_name": "llmgw-control",
            "worker_exit": _worker_exit,
        }.items():
            self.cfg.set(key, value)
        for key, value in tls.gunicorn_options(cfg.tls_cert, cfg.tls_key).items():
            self.cfg.set(key, value)
        if "control_socket_disable" in self.cfg.settings:
            self.cfg.set("control_socket_disable", True)

    def load(self) -> Any:
        # In the worker (no preload): below the reconciler's priority (LLMGW_WEB_NICE),
        # its steady nodes' last reports written in batches.
        os.nice(self.llmgw_config.web_nice)
        app = create_app(self.llmgw_config)
        app.extensions["llmgw.heartbeats"].start()
        gckeeper.Keeper().start()       # no collector stops of a second at fleet scale
        return app


def _worker_exit(server: Any, worker: Any) -> None:
    """A stopping worker writes the last reports it still holds, and sends the spans it
    holds (when tracing: control/tracing.py)."""
    app = getattr(worker, "wsgi", None)
    beats = getattr(app, "extensions", {}).get("llmgw.heartbeats")
    try:
        if beats is not None:
            beats.stop()
    finally:
        tracing.shutdown()
        quiet_exit()


def quiet_exit() -> None:
    """Flush and close the logging handlers of a gevent worker that is about to exit, and
    drop logging's weak references to them: the interpreter's teardown would otherwise
    collect them after gevent's module globals, and each worker's stop printed "Exception
    ignored in: _removeHandlerRef ... TypeError: 'NoneType' object is not callable" into
    the service's log (logging's lock asking gevent for the current greenlet)."""
    logging.shutdown()
    refs = getattr(logging, "_handlerList", None)
    if isinstance(refs, list):
        refs.clear()


STOPPING_GRACE_S = 3.0    # how long a reconciler that stopped cleanly waits for the server's stop


class ReconcilerKeeper:
    """Runs the reconciler process and starts it again if it dies (1 s doubling to 30 s,
    reset once it ran a minute); stopped when the web server stops."""

    def __init__(self, config: ControlConfig) -> None:
        # Named before gunicorn starts, so every reconciler of this host has its name.
        self.config = dataclasses.replace(config, instance_name=config.instance)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._process: Any = None
        self._thread = threading.Thread(target=self._keep, name="llmgw-reconciler-keeper",
                                        daemon=True)

    def start(self) -> None:
        if self.config.reconcile:
            self._thread.start()

    def _spawn(self) -> Any:
        with self._lock:
            if self._stop.is_set():
                return None
            self._process = start_process(self.config)
            return self._process

    def _keep(self) -> None:
        delay = 1.0
        while True:
            started = time.monotonic()
            process = self._spawn()
            if process is None:
                return
            while process.poll() is None and not self._stop.is_set():
                self._stop.wait(0.5)
            # Status 0: it was told to stop (SIGTERM, Ctrl-C), as a whole server's process
            # group is when it stops: the web server's own stop follows at once, and is
            # no reason for an error line or a new reconciler.
            if process.returncode == 0:
                self._stop.wait(STOPPING_GRACE_S)
            if self._stop.is_set():
                return
            ran = time.monotonic() - started
            delay = 1.0 if ran > 60 else min(delay * 2, 30.0)
            log.error("the reconciler process exited (status %s) after %.0f s; starting it "
                      "again in %.0f s", process.returncode, ran, delay)
            self._stop.wait(delay)

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            process = self._process
        if process is not None and process.poll() is None:
            process.terminate()              # SIGTERM: finish the cycle, release the lease
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def run(config: ControlConfig) -> None:
    store = Store(config.store_url)
    bootstrap(store, config)
    store.dispose()
    keeper = ReconcilerKeeper(config)
    keeper.start()
    master = os.getpid()
    try:
        _Gunicorn(config).run()
    finally:
        if os.getpid() == master:          # not in a worker gunicorn forked and ended
            keeper.stop()
