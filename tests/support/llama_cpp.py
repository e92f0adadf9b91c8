"""The llama.cpp build the tests run: `llama-server` and its RPC worker `ggml-rpc-server`,
built once per machine by `make llama-cpp` (scripts/build-llama-cpp.sh) into
~/.cache/llmgw/llama.cpp/<version>-<flags hash>/bin. `make test` and `make pytest` build it
first; a test run without it fails saying so (it never falls back to a stand-in)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .procs import ROOT

SCRIPT = ROOT / "scripts" / "build-llama-cpp.sh"


def built_bin_dir() -> Path:
    """The cached build's bin directory; fails the test with what to run when it is not
    built yet."""
    done = subprocess.run([str(SCRIPT), "--cached"], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        pytest.fail(f"llama.cpp's llama-server is not built: {done.stderr.strip()}",
                    pytrace=False)
    path = Path(done.stdout.strip())
    for name in ("llama-server", "ggml-rpc-server"):
        assert (path / name).is_file(), f"{path / name} is missing: run `make llama-cpp`"
    return path
