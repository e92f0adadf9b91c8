"""Which relay loop the router runs, compiled or interpreted, and why: what its start-up log
says and ``llmgw doctor`` judges (``router/http/relay.py`` makes the choice; setup.py builds
the compiled one)."""

from __future__ import annotations

import hashlib
import importlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

COMPILED = "llmgw_runtime.router.http._crelay"
DIGEST_NAME = "SOURCE_SHA256"       # set by setup.py in the compiled module
FIX = ("install a C compiler and Python's headers (Debian: apt-get install build-essential "
       "python3-dev) and reinstall llmgw (`make`, or pip install again)")
REBUILD = "reinstall llmgw (`make`, or pip install again) to compile the current source"


@dataclass(frozen=True)
class RelayLoop:
    kind: str = ""                  # compiled | interpreted; "" when the router cannot start
    path: str = ""                  # the module that runs
    why_not_compiled: str | None = None   # interpreted: the choice, or why it is not built
    chosen: bool = False            # interpreted because LLMGW_ROUTER_RELAY says so
    stale: bool = False             # compiled from another version of its source
    problem: str | None = None      # LLMGW_ROUTER_RELAY refuses to start (its own words)

    def describe(self) -> str:
        """One line: ``compiled (path)``, ``interpreted (why)``, or the refusal."""
        if self.problem:
            return f"the router cannot start: {self.problem}"
        if self.kind == "compiled":
            old = (", built from an older relay source: the interpreted source has changed "
                   "since" if self.stale else "")
            return f"compiled ({self.path}{old})"
        return f"interpreted ({self.why_not_compiled})"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _why_not_compiled(choice: str) -> str:
    if choice == "interpreted":
        return "chosen by LLMGW_ROUTER_RELAY=interpreted"
    try:
        importlib.import_module(COMPILED)
    except ImportError as exc:
        if getattr(exc, "name", None) == COMPILED:
            return "the compiled one is not built"
        return f"the compiled one cannot be loaded: {exc}"
    return "the compiled one is built but was not chosen"


def _stale(module: Any) -> bool:
    digest = getattr(module, DIGEST_NAME, None)
    source = Path(module.__file__).with_name("_relay.py")
    try:
        return digest != hashlib.sha256(source.read_bytes()).hexdigest()
    except OSError:
        return False                # an install without the source: nothing to compare


def inspect() -> RelayLoop:
    """The relay loop this process's router would run (it imports the choice, as the
    router does, under this process's ``LLMGW_ROUTER_RELAY``)."""
    try:
        from ..router.http import relay
    except RuntimeError as exc:
        return RelayLoop(problem=str(exc))
    path = str(getattr(relay.impl, "__file__", "") or "")
    if relay.KIND == "compiled":
        return RelayLoop(kind="compiled", path=path, stale=_stale(relay.impl))
    choice = os.environ.get(relay.CHOICE_ENV, "").strip().lower()
    return RelayLoop(kind="interpreted", path=path, why_not_compiled=_why_not_compiled(choice),
                     chosen=choice == "interpreted")
