"""Starting and stopping the processes that router tests and the benchmark need.

Everything binds 127.0.0.1 on free ports; every process started here is stopped by
:func:`stop` (SIGINT, then SIGKILL after a grace period).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FAKE_ENGINE = ROOT / "bench" / "fake_engine.py"

_ROUTER_MAIN = ("import json, sys\n"
                "from llmgw_runtime.router.config import RouterConfig\n"
                "from llmgw_runtime.router.serve import run\n"
                "run(RouterConfig(**json.loads(sys.argv[1])))\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float = 15.0, proc: subprocess.Popen[Any] | None = None,
              ok: tuple[int, ...] = (200,)) -> None:
    """Wait until ``url`` answers one of ``ok``; fail early if ``proc`` died."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status in ok:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return
            last = exc
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout_s} s: {last}")


def start_engine(name: str, port: int | None = None, chunks: int = 5) -> tuple[subprocess.Popen[bytes], str]:
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, str(FAKE_ENGINE), "--port", str(port),
                             "--name", name, "--chunks", str(chunks)],
                            stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", proc=proc)
    except Exception:
        stop(proc)
        raise
    return proc, url


def start_router(control_url: str, token: str, **settings: Any) -> tuple[subprocess.Popen[bytes], str]:
    """``serve.run`` in a subprocess (real gunicorn gevent workers); waits for /openapi.json."""
    port = settings.pop("port", None) or free_port()
    cfg = {"control_url": control_url, "router_token": token, "host": "127.0.0.1",
           "port": port, **settings}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _ROUTER_MAIN, json.dumps(cfg)], env=env,
                            cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/openapi.json", proc=proc)
    except Exception:
        stop(proc)
        raise
    return proc, url


def stop(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
