"""The router: llmgw's OpenAI-compatible HTTP API.

It admits each request to a free slot of a ready replica of the requested model (waiting
in a bounded, fair queue when every slot is busy; ``admit.py``, ``admission.py``,
``slots.py``), picks the replica by prefix affinity or least outstanding requests
(``affinity.py``), proxies and streams the request to it, records last use per replica and
hands the control service the idle map (and the models at capacity) once a tick
(docs/routing.md). Entry points: :func:`llmgw_runtime.router.app.create_app` and
:func:`llmgw_runtime.router.serve.run`; configuration in :class:`RouterConfig`.
"""

from __future__ import annotations

from .config import RouterConfig

__all__ = ["RouterConfig"]
