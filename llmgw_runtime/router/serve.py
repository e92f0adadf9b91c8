"""Serving the router with gunicorn gevent workers, programmatically.

gunicorn's gevent worker patches the standard library before it loads the app, and
:meth:`_RouterApplication.load` imports the app only then, in the worker: pools, threads
and the routes loop are all made after patching. SIGTERM stops gracefully (in-flight
requests get ``graceful_timeout``), SIGINT/SIGQUIT at once (gunicorn's own handling).

Metrics: :func:`run` makes a private directory for prometheus_client's multiprocess mode and
names it in ``PROMETHEUS_MULTIPROC_DIR`` before any worker forks (and before anything imports
prometheus_client: nothing on the way here does), so every worker's counters land there and
``/metrics`` on any worker adds them up. A worker that exits has its in-flight gauge dropped
(``child_exit``); the directory goes when the router stops.

Slots: :func:`run` also makes the shared in-flight counts file (``tables/slots.py``) before any
worker forks; ``pre_fork`` gives each worker a stable row (the lowest free index),
``post_fork`` passes it to the worker, ``child_exit`` zeroes a dead worker's row. The
per-key limits' table (``tables/limits.py``) is made next to it.

Usage: a worker that exits posts the usage it has not reported yet (``worker_exit``), so
a graceful restart loses none; it sends the spans it holds too (when tracing: its tracer
is made with the app, in the worker after the fork, ``tracing.py``).

Connections: each worker is :class:`.http.server.RouterWorker`, gunicorn's gevent worker
with an HTTP/1.1 loop of its own (requests parsed by httptools, deadlines for a request's
head and whole body, an answer's head and body in one send, a lingering close after an
answer given before the body was read). The listen backlog is ``LLMGW_ROUTER_BACKLOG``
(default 2048): connections the kernel holds while every worker is busy accepting.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

from gunicorn.app.base import BaseApplication

from .. import tls, tracing
from ..doctor.relay_loop import inspect as inspect_relay
from ..errors import ConfigError
from .config import RouterConfig
from .tables import homes, limits, slots

GRACEFUL_TIMEOUT_S = 30
BACKLOG_ENV = "LLMGW_ROUTER_BACKLOG"
DEFAULT_BACKLOG = 2048
MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"   # read by prometheus_client at its import
_ROW_ATTR = "llmgw_slot_row"    # on gunicorn's worker object: its row in the slots file


def backlog() -> int:
    """The listen backlog, ``LLMGW_ROUTER_BACKLOG`` or :data:`DEFAULT_BACKLOG`."""
    text = os.environ.get(BACKLOG_ENV, "").strip()
    if not text:
        return DEFAULT_BACKLOG
    if not text.isascii() or not text.isdigit() or not 0 < int(text) <= 65535:
        raise ValueError(f"{BACKLOG_ENV}={text!r}: set it to a whole number of connections "
                         f"from 1 to 65535 (default {DEFAULT_BACKLOG})")
    return int(text)


def gunicorn_options(config: RouterConfig) -> dict[str, Any]:
    host = f"[{config.host}]" if ":" in config.host else config.host
    return {
        "bind": [f"{host}:{config.port}"],
        "workers": config.workers,
        "worker_class": "llmgw_runtime.router.http.server.RouterWorker",
        "backlog": backlog(),
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


def _child_exit(server: Any, worker: Any) -> None:
    """gunicorn hook, in the master: a dead worker's requests are no longer in flight
    (neither in the metrics nor in the shared slot counts)."""
    from prometheus_client import multiprocess

    path = os.environ.get(MULTIPROC_DIR_ENV)
    if path:
        multiprocess.mark_process_dead(worker.pid, path)
    row = getattr(worker, _ROW_ATTR, None)
    slots_file = os.environ.get(slots.FILE_ENV)
    if row is not None and slots_file:
        slots.zero_row(slots_file, row)


def _pre_fork(server: Any, worker: Any) -> None:
    """gunicorn hook, in the master: the new worker's slot row, the lowest one no live
    worker holds (a replacement takes the row its dead predecessor left, zeroed)."""
    taken = {getattr(w, _ROW_ATTR, None) for w in server.WORKERS.values()}
    row = next(i for i in range(len(taken) + 1) if i not in taken)
    slots_file = os.environ.get(slots.FILE_ENV)
    if slots_file and row >= slots.rows_of(slots_file):
        row = -1     # more workers than rows (many TTIN signals): this one counts alone
    setattr(worker, _ROW_ATTR, row)


def _post_fork(server: Any, worker: Any) -> None:
    """gunicorn hook, in the new worker before it loads the app: its slot row."""
    row = getattr(worker, _ROW_ATTR, -1)
    if row >= 0:
        os.environ[slots.ROW_ENV] = str(row)
    else:
        os.environ.pop(slots.ROW_ENV, None)
        logging.getLogger(__name__).warning(
            "worker %s has no slot row: its requests are not counted with the other "
            "workers' (too many workers for the slots file)", os.getpid())


def _worker_exit(server: Any, worker: Any) -> None:
    """gunicorn hook, in the worker as it exits: post the usage not reported yet, and
    the spans not sent yet (when tracing: ``tracing.py``)."""
    app = getattr(worker, "wsgi", None)
    state = getattr(app, "extensions", {}).get("llmgw_router")
    try:
        if state is not None:
            state.usage_reporter.flush()
    finally:
        tracing.shutdown()


class _RouterApplication(BaseApplication):  # type: ignore[misc]
    def __init__(self, config: RouterConfig) -> None:
        self._config = config
        super().__init__()

    def load_config(self) -> None:
        for key, value in gunicorn_options(self._config).items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)
        self.cfg.set("child_exit", _child_exit)
        self.cfg.set("pre_fork", _pre_fork)
        self.cfg.set("post_fork", _post_fork)
        self.cfg.set("worker_exit", _worker_exit)

    def load(self) -> Any:
        from .app import create_app  # imported in the worker, after gevent patched

        app = create_app(self._config)
        # Fetch the routes from the worker's start, not from its first request.
        app.extensions["llmgw_router"].routes.ensure_started()
        return app


def run(config: RouterConfig) -> None:
    """Serve the router until SIGTERM/SIGINT; blocks."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s")
    # Which relay loop runs, compiled or interpreted (router/http/relay.py chooses; the
    # workers import the same choice): a refused LLMGW_ROUTER_RELAY stops the router here.
    relay_loop = inspect_relay()
    if relay_loop.problem:
        raise ConfigError(relay_loop.problem)
    logging.getLogger(__name__).log(logging.WARNING if relay_loop.stale else logging.INFO,
                                    "relay loop: %s", relay_loop.describe())
    metrics_dir = tempfile.mkdtemp(prefix="llmgw-router-metrics-")   # mode 0700
    os.environ[MULTIPROC_DIR_ENV] = metrics_dir     # fresh: no counts of an earlier run
    slots_dir = tempfile.mkdtemp(prefix="llmgw-router-slots-")
    os.environ[slots.FILE_ENV] = slots.create_file(slots_dir, config.workers)
    os.environ[homes.FILE_ENV] = homes.create_file(slots_dir)
    os.environ[limits.FILE_ENV] = limits.create_file(slots_dir)
    try:
        _RouterApplication(config).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
        shutil.rmtree(slots_dir, ignore_errors=True)
