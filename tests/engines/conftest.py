"""Real CPU engines (the xllamacpp launcher) on 127.0.0.1, with the tiny random GGUF."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw_runtime.engines import LAUNCHER_MODULE
from tests.support.procs import free_port, http_ok, wait_until
from tests.support.tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("engines") / "tiny.gguf")


@contextlib.contextmanager
def cpu_engine(model: Path, log: Path, *args: str) -> Iterator[str]:
    """The launcher serving ``model`` as ``tiny`` with ``args``; yields its base URL and
    stops it (SIGTERM) afterwards, asserting a clean exit."""
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", LAUNCHER_MODULE, "--model", str(model), "--host",
             "127.0.0.1", "--port", str(port), "--alias", "tiny", *args],
            stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or http_ok(url + "/health"), 30,
                   "the CPU engine's /health")
        assert proc.poll() is None, f"the engine exited: {log.read_text()[-2000:]}"
        yield url
    finally:
        proc.terminate()
        try:
            code = proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            raise
    assert code == 0, f"the engine exited with {code}: {log.read_text()[-2000:]}"
