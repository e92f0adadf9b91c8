"""Starting llmgw's own processes for tests: free ports, waiting, stopping, log tails."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as exc:  # noqa: BLE001 - keep polling, show the last failure
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


def http_ok(url: str, ca_file: str | None = None) -> bool:
    import ssl

    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


class LlmgwProcess:
    """``python -m llmgw_runtime.cli.main ARGS`` in its own session, output to a log."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path,
                 new_session: bool = True) -> None:
        self.name = name
        self.log = log_dir / f"{name}.log"
        self._fh = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        full_env.update(env)
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env["PYTHONPATH"] = str(ROOT)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw_runtime.cli.main", *args], env=full_env,
            stdout=self._fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=new_session, cwd=str(log_dir))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 20, signalled: bool = False) -> None:
        """SIGTERM (unless ``signalled`` already) and wait; SIGKILL after ``timeout``."""
        terminate(self.proc, timeout, signalled)
        self._fh.close()


def terminate(proc: subprocess.Popen[Any], timeout: float, signalled: bool = False) -> None:
    """SIGTERM a process started in its own session; SIGKILL its group after ``timeout``."""
    if proc.poll() is not None:
        return
    if not signalled:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except OSError:
        return False


def descendants(pid: int) -> set[int]:
    """Every live process whose ancestry leads to ``pid``."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier and p not in found}
        found |= frontier
    return found
