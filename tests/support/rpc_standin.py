"""Stand-ins for llama.cpp's RPC build, which the xllamacpp wheel on these machines lacks
("RPC not supported in this build"): the same command lines as ``rpc-server`` and
``llama-server --rpc``, so the agent, the driver and the control service are exercised for
real; only the engine is replaced.

    rpc_standin.py rpc-server --host H --port P
        listens on H:P and accepts connections, like rpc-server.
    rpc_standin.py llama-server -m MODEL --host H --port P --alias NAME --rpc A:P[,A:P] ...
        exits 1 unless every --rpc endpoint accepts a connection (llama-server fails the
        same way), then serves OpenAI answers (bench/fake_engine.py) naming its workers.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

FAKE_ENGINE = Path(__file__).resolve().parents[2] / "bench" / "fake_engine.py"


def _flag(argv: list[str], name: str, default: str | None = None) -> str:
    if name in argv:
        return argv[argv.index(name) + 1]
    if default is None:
        sys.exit(f"missing {name}")
    return default


def rpc_server(argv: list[str]) -> None:
    server = socket.create_server((_flag(argv, "--host"), int(_flag(argv, "--port"))))
    print(f"rpc-server stand-in listening on {server.getsockname()}", flush=True)
    while True:
        conn, _ = server.accept()
        conn.close()


def llama_server(argv: list[str]) -> None:
    workers = [w for w in _flag(argv, "--rpc", "").split(",") if w]
    for worker in workers:
        host, _, port = worker.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=2).close()
        except OSError as exc:
            print(f"failed to connect to RPC server {worker}: {exc}", flush=True)
            sys.exit(1)
    name = f"{_flag(argv, '--alias')}+rpc:{','.join(workers)}"
    os.execv(sys.executable, [sys.executable, str(FAKE_ENGINE), "--host",
                              _flag(argv, "--host"), "--port", _flag(argv, "--port"),
                              "--name", name])


if __name__ == "__main__":
    {"rpc-server": rpc_server, "llama-server": llama_server}[sys.argv[1]](sys.argv[2:])
