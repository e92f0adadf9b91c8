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


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_block() -> range:
    """This test process's own ports: below the kernel's ephemeral range, one block per worker.

    A port the kernel handed out for ``bind(0)`` comes from the range it also gives every
    outgoing connection, and a test that stops a server and starts it again on the same
    port (a Patroni member after a failover) can then find it taken by some client's socket,
    most often one of the other pytest-xdist worker's. Ports below that range are only ever
    taken by a bind, and each worker draws from its own block, so none hands out another's.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    top = min(_ephemeral_low(), 65536)
    size = max((top - 10000) // 8, 256)
    low = 10000 + (index % 8) * size
    return range(low, low + size)


_BLOCK = _port_block()
_NEXT = [_BLOCK.start + (os.getpid() * 7919) % len(_BLOCK)]


def free_port() -> int:
    """A port free on 127.0.0.1 now and not handed out before by this process."""
    for _ in range(len(_BLOCK)):
        port = _NEXT[0]
        _NEXT[0] = port + 1 if port + 1 < _BLOCK.stop else _BLOCK.start
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {_BLOCK.start}-{_BLOCK.stop - 1}")


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
                 new_session: bool = True, ignoring: tuple[str, ...] = ()) -> None:
        """``ignoring``: signals (``"INT"``, ...) the process starts with ignored."""
        self.name = name
        self.log = log_dir / f"{name}.log"
        self._fh = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        full_env.update(env)
        full_env["PYTHONUNBUFFERED"] = "1"
        full_env["PYTHONPATH"] = str(ROOT)
        argv = [sys.executable, "-m", "llmgw_runtime.cli.main", *args]
        if ignoring:           # the shell's trap sets them ignored, kept across its exec
            argv = ["sh", "-c", f"trap '' {' '.join(ignoring)}; exec \"$@\"", "sh", *argv]
        self.proc = subprocess.Popen(
            argv, env=full_env,
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


def children(pid: int) -> list[tuple[int, list[str]]]:
    """The processes whose parent is ``pid``, with their command lines."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append((int(entry.name), argv))
    return found


def nice(pid: int) -> int:
    """A process's nice value (/proc/PID/stat's 19th field)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
