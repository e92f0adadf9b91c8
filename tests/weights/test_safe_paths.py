"""A download writes only inside its weights directory: a source's file name is one plain path
component, and what the agent writes resolves inside the directory, links or not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw_runtime.errors import EngineError
from llmgw_runtime.weights.fetch import Fetch, FetchManager
from llmgw_runtime.weights.hf_download import download_hf
from llmgw_runtime.weights.safepath import name_problem, outside
from llmgw_runtime.weights.sources import parse_source
from llmgw_runtime.weights.transfer import FetchError
from tests.weights.loopback import LoopbackServer


@pytest.fixture
def manager() -> Iterator[FetchManager]:
    m = FetchManager(http_attempts=1, timeout_s=10)
    yield m
    m.close()


@pytest.mark.parametrize("source, words", [
    ("https://h/a%2F..%2F..%2Fetc%2Fpasswd", "'a/../../etc/passwd' once decoded, holds a path "
                                              "separator"),
    ("https://h/x/%2Froot%2F.bashrc", "holds a path separator"),
    ("https://h/..%5Cwin", "holds a path separator"),
    ("https://h/m%00.gguf", "holds a control character"),
    ("https://h/m%0A.gguf", "holds a control character"),
    ("https://h/.hidden", "starts with a dot"),
    ("https://h/m.gguf.incomplete", "partial downloads"),
    ("https://h/" + "%C3%A9" * 128, "longer than 255 bytes"),
    ("hf://org/repo/sub/../../../x", "the part '..' is . or .."),
    ("hf://../repo/x.gguf", "the part '..' is . or .."),
    ("hf://org/repo/a\\b.gguf", "holds a path separator"),
])
def test_a_source_that_would_name_a_path_outside_is_refused(source: str, words: str) -> None:
    with pytest.raises(EngineError) as info:
        parse_source(source)
    assert words in info.value.message and "source '" in info.value.message


def test_a_plain_name_is_decoded_and_kept() -> None:
    assert parse_source("https://h/dir/m%20v2.gguf?sig=s").name == "m v2.gguf"
    assert parse_source("hf://org/repo/dir/m.gguf").filename == "dir/m.gguf"
    assert name_problem("qwen2.5-7b-instruct-q4_k_m.gguf") is None


def test_an_encoded_traversal_fails_the_fetch_and_writes_nothing(
        server: LoopbackServer, manager: FetchManager, tmp_path: Path) -> None:
    weights = tmp_path / "deep" / "weights"
    weights.mkdir(parents=True)
    server.behaviour.files["/x/..%2F..%2Fescaped"] = b"payload"
    fetch = manager.ensure("r1", server.url + "/x/..%2F..%2Fescaped", [weights])
    assert fetch.state == "failed" and "holds a path separator" in (fetch.error or "")
    assert server.behaviour.requests == []
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["deep", "weights"]


def test_a_partial_file_linked_outside_is_never_written_through(
        server: LoopbackServer, manager: FetchManager, weights_dir: Path,
        tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    (weights_dir / "tiny.gguf.part").symlink_to(target)
    server.behaviour.files["/models/tiny.gguf"] = b"payload"
    fetch = manager.ensure("r1", server.url + "/models/tiny.gguf", [weights_dir])
    assert fetch.wait(30)
    assert fetch.state == "failed"
    assert "outside the weights directory" in (fetch.error or "")
    assert target.read_text() == "keep me"


def test_an_hf_cache_folder_linked_outside_is_refused_before_downloading(
        weights_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (weights_dir / "models--org--repo").symlink_to(elsewhere)
    src = parse_source("hf://org/repo/m.gguf")
    with pytest.raises(FetchError, match="outside the weights directory"):
        download_hf(Fetch(src.raw), src, weights_dir, endpoint="http://127.0.0.1:9")
    assert list(elsewhere.iterdir()) == []


def test_outside_resolves_links_and_dots(tmp_path: Path) -> None:
    base = tmp_path / "w"
    base.mkdir()
    (base / "in").symlink_to(base / "sub")
    (base / "out").symlink_to(tmp_path)
    assert outside(base, base / "m.gguf", "x") is None
    assert outside(base, base / "in" / "m.gguf", "x") is None
    assert "outside the weights directory" in (outside(base, base / "out" / "m", "x") or "")
    assert outside(base, base / ".." / "m", "x") is not None
    assert outside(base, base, "x") is not None
