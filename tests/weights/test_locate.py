from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw_runtime.errors import EngineError
from llmgw_runtime.weights.locate import candidates, complete, find, resolve

COMMIT = "a" * 40
OLD_COMMIT = "b" * 40


def write(path: Path, data: bytes = b"weights") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def hf_cache(base: Path, files: dict[str, bytes], *, org: str = "Org", repo: str = "Repo",
             commit: str = COMMIT, ref: str | None = "main", tree: bool = False) -> Path:
    """A huggingface_hub cache entry as the library lays it out: blobs, snapshot links, refs,
    and (after a snapshot download) the tree listing."""
    folder = base / f"models--{org}--{repo}"
    snap = folder / "snapshots" / commit
    for name, data in files.items():
        blob = write(folder / "blobs" / hashlib.sha256(data).hexdigest(), data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    snap.mkdir(parents=True, exist_ok=True)
    if ref:
        write(folder / "refs" / ref, commit.encode())
    if tree:
        listing = {n: {"size": len(d), "blob_id": "x"} for n, d in files.items()}
        write(folder / "trees" / f"{commit}.json",
              json.dumps({"format_version": 1, "files": listing}).encode())
    return snap


def sharded(d: Path, shards: dict[str, bytes]) -> Path:
    """A safetensors checkpoint: its index names two shards; only ``shards`` are written."""
    d.mkdir(parents=True, exist_ok=True)
    index = {"metadata": {"total_size": 10},
             "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                            "b.weight": "model-00002-of-00002.safetensors"}}
    write(d / "model.safetensors.index.json", json.dumps(index).encode())
    write(d / "config.json", b"{}")
    for name, data in shards.items():
        write(d / name, data)
    return d


# -- candidates ---------------------------------------------------------------------------

def test_hf_file_candidates_in_order(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    snap = hf_cache(b, {"sub/q4.gguf": b"x"})
    got = candidates("hf://Org/Repo/sub/q4.gguf", [a, str(b)])
    assert got == [a / "Org/Repo/sub/q4.gguf", a / "sub/q4.gguf", a / "q4.gguf",
                   b / "Org/Repo/sub/q4.gguf", b / "sub/q4.gguf", b / "q4.gguf",
                   snap / "sub/q4.gguf"]


def test_hf_cache_snapshots_the_main_ref_points_to_come_first(tmp_path: Path) -> None:
    hf_cache(tmp_path, {"q4.gguf": b"old"}, commit=OLD_COMMIT, ref=None)
    hf_cache(tmp_path, {"q4.gguf": b"new"}, commit="c" * 40, ref="main")
    snaps = [p for p in candidates("hf://Org/Repo/q4.gguf", [tmp_path])
             if p.parent.parent.name == "snapshots"]
    assert [p.parent.name for p in snaps] == ["c" * 40, OLD_COMMIT]


def test_a_dir_that_is_an_hf_home_is_searched_under_hub(tmp_path: Path) -> None:
    snap = hf_cache(tmp_path / "hub", {"q4.gguf": b"x"})
    assert find("hf://Org/Repo/q4.gguf", [tmp_path]) == snap / "q4.gguf"


def test_hf_repo_candidates(tmp_path: Path) -> None:
    snap = hf_cache(tmp_path, {"model.safetensors": b"x"})
    assert candidates("hf://Org/Repo", [tmp_path]) == [tmp_path / "Org/Repo", tmp_path / "Repo",
                                                        snap]


def test_https_and_file_candidates(tmp_path: Path) -> None:
    assert candidates("https://h.example/dl/m%20q4.gguf?sig=1", [tmp_path]) == [
        tmp_path / "m q4.gguf"]
    assert candidates("file:///srv/m.gguf", [tmp_path]) == [Path("/srv/m.gguf")]
    assert candidates("/srv/m.gguf", []) == [Path("/srv/m.gguf")]


@pytest.mark.parametrize("source", ["relative/m.gguf", "hf://only-org", "file://host/m.gguf",
                                    "https://host.example/", "s3://bucket/m.gguf"])
def test_bad_sources_are_refused_naming_the_source(source: str) -> None:
    with pytest.raises(EngineError, match="source"):
        candidates(source, [])


# -- complete -----------------------------------------------------------------------------

def test_a_non_empty_file_is_weights(tmp_path: Path) -> None:
    assert complete(write(tmp_path / "m.gguf")) is None


@pytest.mark.parametrize("name", ["m.gguf.part", "m.gguf.incomplete", "m.gguf.tmp"])
def test_partial_downloads_are_not_weights(tmp_path: Path, name: str) -> None:
    reason = complete(write(tmp_path / name))
    assert reason is not None and "partial" in reason


@pytest.mark.parametrize("build, words", [
    (lambda p: p, "does not exist"),
    (lambda p: write(p, b""), "empty (0 bytes)"),
    (lambda p: (p.mkdir(), p)[1], "empty directory"),
    (lambda p: write(p / "config.json", b"{}").parent, "no weight file"),
    (lambda p: (write(p / "a.safetensors"), write(p / "b.safetensors.part"))[0].parent,
     "partial download"),
    (lambda p: write(p / "m.gguf", b"").parent, "empty weight file"),
])
def test_what_is_not_weights_says_why(tmp_path: Path, build: Callable[[Path], Path],
                                      words: str) -> None:
    path = build(tmp_path / "thing")
    reason = complete(path)
    assert reason is not None and words in reason and str(path) in reason


def test_an_hf_incomplete_blob_link_is_not_weights(tmp_path: Path) -> None:
    blob = write(tmp_path / "blobs" / "abc.incomplete")
    (tmp_path / "m.gguf").symlink_to(blob)
    assert "partial" in (complete(tmp_path / "m.gguf") or "")


def test_a_link_counts_when_its_target_is_complete(tmp_path: Path) -> None:
    snap = hf_cache(tmp_path, {"q4.gguf": b"data"})
    assert (snap / "q4.gguf").is_symlink() and complete(snap / "q4.gguf") is None
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert "broken link" in (complete(tmp_path / "dangling") or "")


def test_a_sharded_checkpoint_counts_once_every_shard_is_there(tmp_path: Path) -> None:
    d = sharded(tmp_path / "model", {"model-00001-of-00002.safetensors": b"one"})
    reason = complete(d)
    assert reason is not None and "model-00002-of-00002.safetensors" in reason
    assert "missing" in reason
    write(d / "model-00002-of-00002.safetensors", b"")
    assert "empty" in (complete(d) or "")
    write(d / "model-00002-of-00002.safetensors", b"two")
    assert complete(d) is None


def test_an_unreadable_index_is_not_weights(tmp_path: Path) -> None:
    d = sharded(tmp_path / "model", {"model-00001-of-00002.safetensors": b"one",
                                     "model-00002-of-00002.safetensors": b"two"})
    write(d / "model.safetensors.index.json", b"{not json")
    assert "cannot be read" in (complete(d) or "")


def test_an_unfinished_hf_snapshot_is_not_weights(tmp_path: Path) -> None:
    files = {"config.json": b"{}", "model.safetensors": b"w"}
    snap = hf_cache(tmp_path, files, tree=True)
    assert complete(snap) is None
    (snap / "config.json").unlink()
    assert "unfinished snapshot" in (complete(snap) or "")


# -- find and resolve -------------------------------------------------------------------

def test_find_skips_incomplete_candidates_for_a_later_complete_one(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    write(a / "q4.gguf", b"")                    # empty: not weights
    write(a / "q4.gguf.part", b"half")
    good = write(b / "Org/Repo/q4.gguf")
    assert find("hf://Org/Repo/q4.gguf", [a, b]) == good
    assert find("hf://Org/Repo/q8.gguf", [a, b]) is None


def test_find_https_source_by_the_url_basename(tmp_path: Path) -> None:
    write(tmp_path / "m.gguf.part", b"half")
    assert find("https://h.example/x/m.gguf", [tmp_path]) is None
    good = write(tmp_path / "m.gguf")
    assert find("https://h.example/x/m.gguf", [tmp_path]) == good


def test_resolve_names_the_source_the_dirs_and_what_it_saw(tmp_path: Path) -> None:
    write(tmp_path / "q4.gguf", b"")
    with pytest.raises(EngineError) as err:
        resolve("hf://Org/Repo/q4.gguf", [tmp_path, "/nowhere"])
    text = str(err.value)
    assert "hf://Org/Repo/q4.gguf" in text and str(tmp_path) in text and "/nowhere" in text
    assert "empty (0 bytes)" in text and "LLMGW_WEIGHTS_DIRS" in text
    with pytest.raises(EngineError, match="none configured"):
        resolve("hf://Org/Repo/q4.gguf", [])


def test_resolve_hides_a_url_query_string(tmp_path: Path) -> None:
    with pytest.raises(EngineError) as err:
        resolve("https://h.example/m.gguf?X-Amz-Signature=SECRET", [tmp_path])
    assert "SECRET" not in str(err.value) and "https://h.example/m.gguf" in str(err.value)


def test_resolve_file_sources_checks_them_unless_told_not_to(tmp_path: Path) -> None:
    good = write(tmp_path / "m.gguf")
    assert resolve(f"file://{good}", []) == good
    with pytest.raises(EngineError, match="does not exist"):
        resolve(str(tmp_path / "missing.gguf"), [])
    assert resolve(str(tmp_path / "missing.gguf"), [], check_files=False) == \
        tmp_path / "missing.gguf"
