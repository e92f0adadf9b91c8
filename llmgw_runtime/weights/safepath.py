"""Where a download may write: a file name that is one plain path component, and a path that,
once resolved, is inside the weights directory it is written into.

``name_problem`` is pure (the catalog's validation uses it through ``parse_source``);
``outside`` reads the filesystem (links) and is asked where the agent writes.
"""

from __future__ import annotations

import os
from pathlib import Path

MAX_NAME_BYTES = 255                    # a file name on Linux filesystems
PARTIAL_SUFFIXES = (".part", ".incomplete", ".tmp")   # a partial download: never weights


def component_problem(part: str) -> str | None:
    """Why ``part`` cannot be one component of a path under a weights directory, or None:
    empty, ``.`` or ``..``, a ``/`` or ``\\``, a control character (NUL, newline, ...) or
    more than 255 bytes in UTF-8."""
    if not part:
        return "is empty"
    if part in (".", ".."):
        return "is . or .."
    if "/" in part or "\\" in part:
        return "holds a path separator (/ or \\)"
    if not part.isprintable():
        return "holds a control character (NUL, newline, ...)"
    if len(part.encode("utf-8", errors="surrogatepass")) > MAX_NAME_BYTES:
        return f"is longer than {MAX_NAME_BYTES} bytes"
    return None


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a downloaded file's name in a weights directory, or None: it
    is one path component (component_problem), does not start with a dot (hidden names
    would collide with the ``.locks`` folder) and does not end with a partial-download
    suffix (.part, .incomplete, .tmp: never counted as weights)."""
    problem = component_problem(name)
    if problem is not None:
        return problem
    if name.startswith("."):
        return "starts with a dot"
    if name.endswith(PARTIAL_SUFFIXES):
        return f"ends with {', '.join(PARTIAL_SUFFIXES)}, which mark partial downloads"
    return None


def outside(base: Path, path: Path, what: str) -> str | None:
    """None when ``path``, once every link is resolved, lies strictly inside ``base``
    (resolved too); else why it may not be written, naming both. ``what`` says what was to
    be written."""
    root = Path(os.path.realpath(base))
    real = Path(os.path.realpath(path))
    if root in real.parents:
        return None
    return (f"refusing to write {what} at {path}: it resolves to {real}, outside the "
            f"weights directory {root}; remove the link that leads there")
