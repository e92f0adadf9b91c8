"""Compatibility: the router's gunicorn worker is :class:`.http.server.RouterWorker` now
(requests parsed by httptools); this name stays for configurations that still point here."""

from __future__ import annotations

from .http.server import RouterWorker

__all__ = ["RouterWorker"]
