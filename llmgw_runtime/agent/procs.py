"""Small process helpers for the supervisor (Linux ``/proc``)."""

from __future__ import annotations

import os
import socket
from pathlib import Path


def proc_start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks since boot), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces or ')': fields resume after the last ')'.
    rest = text[text.rfind(")") + 2:].split()
    try:
        return int(rest[22 - 3])
    except (IndexError, ValueError):
        return None


def _proc_state(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()
    return rest[0] if rest else None


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, if given, started at ``start_time``."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    state = _proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    return start_time is None or proc_start_time(pid) == start_time


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that nothing listens on now (the OS picks it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tail_lines(path: Path, n: int = 15, max_bytes: int = 64 * 1024) -> str:
    """The last ``n`` non-empty lines of a file (reading at most ``max_bytes`` of its end)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except OSError:
        return ""
    lines = [ln.rstrip() for ln in data.decode("utf-8", errors="replace").splitlines()]
    return "\n".join([ln for ln in lines if ln.strip()][-n:])
