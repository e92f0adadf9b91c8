"""Fixtures for the weights tests: a loopback HTTP server and a tiny real GGUF."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.tiny_gguf import write_tiny_gguf
from tests.weights.loopback import LoopbackServer


@pytest.fixture(scope="session")
def gguf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real tiny GGUF (about half a megabyte)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf").read_bytes()


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    srv = LoopbackServer().start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def weights_dir(tmp_path: Path) -> Path:
    d = tmp_path / "weights"
    d.mkdir()
    return d
