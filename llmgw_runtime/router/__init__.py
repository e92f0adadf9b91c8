"""The router: llmgw's OpenAI-compatible HTTP API.

It admits each request to a free slot of a ready replica of the requested model (waiting
in a bounded, fair queue when every slot is busy), picks the replica by prefix affinity or
by free slots (``admission/``), proxies and streams the request to it (``proxy.py`` over
``http/``), records last use per replica and hands the control service the idle map (and
the models at capacity) once a tick (docs/routing.md). What its gunicorn workers share,
slot counts, prefix homes and key limits, lives in files they all map (``tables/``). Entry points: :func:`llmgw_runtime.router.app.create_app` and
:func:`llmgw_runtime.router.serve.run`; configuration in :class:`RouterConfig`.
"""

from __future__ import annotations

from .config import RouterConfig

__all__ = ["RouterConfig"]
