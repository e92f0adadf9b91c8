"""The router: llmgw's OpenAI-compatible HTTP API.

It picks a ready replica of the requested model (least outstanding requests), proxies and
streams the request to it, records last use per replica and hands the control service the
idle map once a tick. Entry points: :func:`llmgw_runtime.router.app.create_app` and
:func:`llmgw_runtime.router.serve.run`; configuration in :class:`RouterConfig`.
"""

from __future__ import annotations

from .config import RouterConfig

__all__ = ["RouterConfig"]
