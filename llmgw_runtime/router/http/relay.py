"""The relay loop, compiled or interpreted: ``_relay.py`` is its one source (Cython's pure
Python mode); ``pip install`` compiles it as ``_crelay`` where a C compiler and Python's
headers are there. ``LLMGW_ROUTER_RELAY`` chooses: ``auto`` (the default: compiled when
built), ``compiled`` (refuse to start without it) or ``interpreted``. :data:`KIND` says which
one runs (the router's start-up log and ``llmgw doctor`` show it)."""

from __future__ import annotations

import os

CHOICE_ENV = "LLMGW_ROUTER_RELAY"
CHOICES = ("auto", "compiled", "interpreted")
__all__ = ["CHOICE_ENV", "CHOICES", "KIND", "impl"]

_choice = os.environ.get(CHOICE_ENV, "auto").strip().lower() or "auto"
if _choice not in CHOICES:
    raise RuntimeError(f"{CHOICE_ENV}={_choice!r}: use one of {', '.join(CHOICES)}")
if _choice == "interpreted":
    from . import _relay as impl
    KIND = "interpreted"
else:
    try:
        from . import _crelay as impl  # type: ignore[attr-defined,no-redef]
        KIND = "compiled"
    except ImportError as exc:
        if _choice == "compiled":
            raise RuntimeError(f"{CHOICE_ENV}=compiled, but the compiled relay is not built "
                               f"({exc}): reinstall llmgw with a C compiler and Python's "
                               "headers (Debian: build-essential python3-dev)") from None
        from . import _relay as impl
        KIND = "interpreted"
