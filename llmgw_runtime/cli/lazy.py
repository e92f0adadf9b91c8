"""A module loaded when one of its names is first used, not when it is imported: ``ctl``'s
commands name the admin API's answers (``api.admin``: pydantic models, a sixth of a
second of CPU to build) but ``ctl status`` reads none of them."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def lazy(name: str) -> ModuleType:
    """``name``'s module, loaded on first attribute access (the module itself if it is
    loaded already)."""
    found = sys.modules.get(name)
    if found is not None:
        return found
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no module named {name!r}")
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    loader.exec_module(module)
    return module
