"""Fixed-size tables every worker of one router maps (prefix homes, key limits): made
empty by ``serve.run`` in the router's private directory before the workers fork, mapped
by each worker; without a file (an app made in-process), private memory."""

from __future__ import annotations

import mmap
import os


def create(directory: str, name: str, size: int) -> str:
    """The empty table ``name`` of ``size`` bytes in ``directory`` (private: mode 0700)."""
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def mapped(path: str | None, size: int, what: str) -> mmap.mmap | bytearray:
    """The table at ``path`` mapped shared (ValueError when it is not ``size`` bytes: not
    a ``what``), or private zeroed memory without a path."""
    if path is None:
        return bytearray(size)
    fd = os.open(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size != size:
            raise ValueError(f"{path} is not a {what} of {size} bytes")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
