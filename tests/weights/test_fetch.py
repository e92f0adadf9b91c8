from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.weights.fetch import Fetch, FetchManager, pick_dest
from llmgw_runtime.weights.locate import complete, find
from llmgw_runtime.weights.mounts import Mount
from llmgw_runtime.weights.scan import scan
from tests.weights.loopback import HubRepo, LoopbackServer

PATH = "/models/tiny.gguf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def manager() -> Iterator[FetchManager]:
    m = FetchManager(http_attempts=1, timeout_s=10)
    yield m
    m.close()


def finished(fetch: Fetch) -> Fetch:
    assert fetch.wait(30), "the fetch did not finish"
    return fetch


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- https ---------------------------------------------------------------------------------

def test_downloads_verifies_and_renames(server: LoopbackServer, manager: FetchManager,
                                        weights_dir: Path, gguf_bytes: bytes) -> None:
    server.behaviour.files[PATH] = gguf_bytes
    fetch = finished(manager.ensure("r1", server.url + PATH, [weights_dir],
                                    sha256=sha(gguf_bytes), size_bytes=len(gguf_bytes)))
    assert fetch.state == "done" and fetch.error is None
    assert fetch.path == weights_dir / "tiny.gguf"
    assert fetch.path.read_bytes() == gguf_bytes
    assert not (weights_dir / "tiny.gguf.part").exists()
    assert fetch.progress()["bytes"] == fetch.progress()["total"] == len(gguf_bytes)
    assert manager.get("r1") is fetch


def test_an_interrupted_download_is_never_weights_and_resumes_with_a_range(
        server: LoopbackServer, manager: FetchManager, weights_dir: Path,
        gguf_bytes: bytes) -> None:
    source = server.url + PATH
    server.behaviour.files[PATH] = gguf_bytes
    server.behaviour.cuts[PATH] = [100_000]
    first = finished(manager.ensure("r1", source, [weights_dir], sha256=sha(gguf_bytes)))
    assert first.state == "failed"
    assert source in (first.error or "") and "resumes" in (first.error or "")
    part = weights_dir / "tiny.gguf.part"
    assert part.stat().st_size == 100_000
    assert not (weights_dir / "tiny.gguf").exists()
    assert find(source, [weights_dir]) is None
    assert scan([source], [weights_dir], [Mount("/", "ext4")])["sources"] == {}
    assert manager.ensure("r1", source, [weights_dir]) is first     # kept until forgotten

    manager.forget("r1")
    second = finished(manager.ensure("r1", source, [weights_dir], sha256=sha(gguf_bytes)))
    assert second.state == "done", second.error
    assert server.gets(PATH)[-1]["range"] == "bytes=100000-"
    assert (weights_dir / "tiny.gguf").read_bytes() == gguf_bytes
    assert not part.exists()
    assert find(source, [weights_dir]) == weights_dir / "tiny.gguf"


def test_one_fetch_resumes_by_itself_after_a_cut(server: LoopbackServer, weights_dir: Path,
                                                 gguf_bytes: bytes) -> None:
    server.behaviour.files[PATH] = gguf_bytes
    server.behaviour.cuts[PATH] = [50_000, 70_000]
    manager = FetchManager(http_attempts=3)
    fetch = finished(manager.ensure("r1", server.url + PATH, [weights_dir],
                                    sha256=sha(gguf_bytes)))
    assert fetch.state == "done", fetch.error
    assert [r["range"] for r in server.gets(PATH)] == [None, "bytes=50000-", "bytes=120000-"]
    assert fetch.path is not None and fetch.path.read_bytes() == gguf_bytes


def test_a_server_that_ignores_range_means_starting_over(
        server: LoopbackServer, manager: FetchManager, weights_dir: Path,
        gguf_bytes: bytes) -> None:
    server.behaviour.files[PATH] = gguf_bytes
    server.behaviour.ignore_range = True
    (weights_dir / "tiny.gguf.part").write_bytes(b"stale bytes of another file")
    fetch = finished(manager.ensure("r1", server.url + PATH, [weights_dir],
                                    sha256=sha(gguf_bytes)))
    assert fetch.state == "done", fetch.error
    assert server.gets(PATH)[0]["range"] == "bytes=27-"
    assert (weights_dir / "tiny.gguf").read_bytes() == gguf_bytes


def test_a_part_already_whole_is_verified_after_416(
        server: LoopbackServer, manager: FetchManager, weights_dir: Path,
        gguf_bytes: bytes) -> None:
    server.behaviour.files[PATH] = gguf_bytes
    (weights_dir / "tiny.gguf.part").write_bytes(gguf_bytes)
    fetch = finished(manager.ensure("r1", server.url + PATH, [weights_dir],
                                    sha256=sha(gguf_bytes), size_bytes=len(gguf_bytes)))
    assert fetch.state == "done", fetch.error
    assert (weights_dir / "tiny.gguf").read_bytes() == gguf_bytes


def test_checksum_mismatch_fails_naming_both_sums_and_keeps_nothing(
        server: LoopbackServer, manager: FetchManager, weights_dir: Path,
        gguf_bytes: bytes) -> None:
    wrong = bytes(reversed(gguf_bytes))
    server.behaviour.files[PATH] = gguf_bytes
    server.behaviour.wrong[PATH] = wrong
    fetch = finished(manager.ensure("r1", server.url + PATH, [weights_dir],
                                    sha256=sha(gguf_bytes).upper()))
    assert fetch.state == "failed"
    error = fetch.error or ""
    assert "sha256 mismatch" in error and sha(gguf_bytes) in error and sha(wrong) in error
    assert server.url + PATH in error
    assert list(weights_dir.glob("tiny.gguf*")) == []


def test_size_mismatch_fails_and_deletes_the_part(
        server: LoopbackServer, manager: FetchManager, weights_dir: Path,
        gguf_bytes: bytes) -> None:
    server.behaviour.files[PATH] = gguf_bytes
    fetch = finished(manager.ensure("r1", server.url + PATH, [weights_dir],
                                    size_bytes=len(gguf_bytes) + 1))
    assert fetch.state == "failed"
    assert f"expected {len(gguf_bytes) + 1} bytes" in (fetch.error or "")
    assert f"got {len(gguf_bytes)}" in (fetch.error or "")
    assert list(weights_dir.glob("tiny.gguf*")) == []


def test_404_fails_with_the_status_and_the_url_but_no_query_secret(
        server: LoopbackServer, manager: FetchManager, weights_dir: Path) -> None:
    fetch = finished(manager.ensure("r1", server.url + "/nope/m.gguf?token=SECRET",
                                    [weights_dir]))
    assert fetch.state == "failed"
    error = fetch.error or ""
    assert "404" in error and server.url + "/nope/m.gguf" in error and "SECRET" not in error
    assert "SECRET" not in fetch.as_dict()["source"]


def test_an_unreachable_server_fails_plainly(manager: FetchManager, weights_dir: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # nothing listens there once closed
    fetch = finished(manager.ensure("r1", f"http://127.0.0.1:{port}/m.gguf", [weights_dir]))
    assert fetch.state == "failed" and "cannot reach the server" in (fetch.error or "")


def test_cancel_stops_the_thread_and_keeps_the_part_for_later(
        server: LoopbackServer, manager: FetchManager, weights_dir: Path,
        gguf_bytes: bytes) -> None:
    server.behaviour.files[PATH] = gguf_bytes
    server.behaviour.delay_s = 0.02
    fetch = manager.ensure("r1", server.url + PATH, [weights_dir])
    part = weights_dir / "tiny.gguf.part"
    deadline = 0
    while fetch.progress()["bytes"] < 50_000 and deadline < 500:
        fetch.wait(0.01)
        deadline += 1
    progress = fetch.progress()
    assert fetch.state == "fetching" and progress["total"] == len(gguf_bytes)
    assert progress["rate_bps"] > 0
    assert manager.cancel("r1")
    finished(fetch)
    assert fetch.state == "failed" and "cancelled" in (fetch.error or "")
    assert part.exists() and 0 < part.stat().st_size < len(gguf_bytes)
    assert not (weights_dir / "tiny.gguf").exists()


def test_two_replicas_fetching_one_file_download_it_once(
        server: LoopbackServer, manager: FetchManager, weights_dir: Path,
        gguf_bytes: bytes) -> None:
    server.behaviour.files[PATH] = gguf_bytes
    server.behaviour.delay_s = 0.001
    a = manager.ensure("r1", server.url + PATH, [weights_dir], sha256=sha(gguf_bytes))
    b = manager.ensure("r2", server.url + PATH, [weights_dir], sha256=sha(gguf_bytes))
    assert finished(a).state == finished(b).state == "done"
    assert a.path == b.path and a.path is not None and a.path.read_bytes() == gguf_bytes
    assert len(server.gets(PATH)) == 1


def test_weights_already_here_make_a_done_fetch_without_a_request(
        server: LoopbackServer, manager: FetchManager, weights_dir: Path) -> None:
    (weights_dir / "tiny.gguf").write_bytes(b"present")
    fetch = manager.ensure("r1", server.url + PATH, [weights_dir])
    assert fetch.state == "done" and fetch.path == weights_dir / "tiny.gguf"
    assert server.behaviour.requests == []
    wrong_size = manager.ensure("r2", server.url + PATH, [weights_dir], size_bytes=3)
    assert wrong_size.state == "failed" and "size_bytes 3" in (wrong_size.error or "")


def test_a_new_source_for_a_key_replaces_the_old_fetch(
        manager: FetchManager, tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"a")
    b.write_bytes(b"b")
    first = manager.ensure("r1", str(a), [tmp_path])
    second = manager.ensure("r1", str(b), [tmp_path])
    assert first is not second and second.path == b
    assert manager.forget("r1") is second and manager.get("r1") is None


# -- file:// -------------------------------------------------------------------------------

def test_a_file_source_is_used_in_place(manager: FetchManager, tmp_path: Path) -> None:
    model = tmp_path / "elsewhere" / "m.gguf"
    model.parent.mkdir()
    model.write_bytes(b"weights")
    fetch = manager.ensure("r1", f"file://{model}", [tmp_path / "weights"])
    assert fetch.state == "done" and fetch.path == model
    assert fetch.progress() == {"bytes": 7, "total": 7, "rate_bps": 0.0}


@pytest.mark.parametrize("make, words", [
    (lambda p: None, "does not exist"),
    (lambda p: p.write_bytes(b""), "empty"),
    (lambda p: p.with_name("m.gguf.part").write_bytes(b"x") and p.symlink_to(
        p.with_name("m.gguf.part")), "partial"),
])
def test_a_bad_file_source_fails_with_the_reason(manager: FetchManager, tmp_path: Path,
                                                 make: Callable[[Path], Any], words: str) -> None:
    model = tmp_path / "m.gguf"
    make(model)
    fetch = manager.ensure("r1", f"file://{model}", [tmp_path])
    assert fetch.state == "failed" and words in (fetch.error or "")
    assert f"file://{model}" in (fetch.error or "")


def test_a_bad_source_fails_without_a_thread(manager: FetchManager, tmp_path: Path) -> None:
    fetch = manager.ensure("r1", "s3://bucket/m.gguf", [tmp_path])
    assert fetch.state == "failed" and "not supported" in (fetch.error or "")


# -- destination -------------------------------------------------------------------------

def test_pick_dest_takes_the_first_existing_writable_dir(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    rw = tmp_path / "rw"
    rw.mkdir()
    missing = tmp_path / "missing"
    if os.geteuid() != 0:
        ro.chmod(0o555)
        assert pick_dest([ro, rw]) == rw
    assert pick_dest([missing, rw]) == rw
    assert not missing.exists()                  # a configured dir is never created
    assert pick_dest([missing], tmp_path / "fallback") == tmp_path / "fallback"
    assert (tmp_path / "fallback").is_dir()
    assert pick_dest([missing]) is None


def test_no_writable_dir_fails_saying_where_it_looked(
        manager: FetchManager, tmp_path: Path) -> None:
    fetch = manager.ensure("r1", "https://h.example/m.gguf", [tmp_path / "missing"])
    assert fetch.state == "failed"
    assert "weights directories" in (fetch.error or "")
    assert str(tmp_path / "missing") in (fetch.error or "")


# -- hf:// ---------------------------------------------------------------------------------

@pytest.fixture
def hub(server: LoopbackServer, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> LoopbackServer:
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))     # no token of the user's
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return server


def test_an_hf_file_lands_in_the_hf_cache_layout_and_is_found_next_time(
        hub: LoopbackServer, manager: FetchManager, weights_dir: Path,
        gguf_bytes: bytes) -> None:
    hub.behaviour.repos["Org/Repo-GGUF"] = HubRepo(COMMIT, {"tiny-q4.gguf": gguf_bytes})
    source = "hf://Org/Repo-GGUF/tiny-q4.gguf"
    fetch = finished(manager.ensure("r1", source, [weights_dir], token="hf_SECRET"))
    assert fetch.state == "done", fetch.error
    snap = weights_dir / "models--Org--Repo-GGUF" / "snapshots" / COMMIT
    assert fetch.path == snap / "tiny-q4.gguf"
    assert fetch.path.read_bytes() == gguf_bytes
    assert fetch.progress()["bytes"] == fetch.progress()["total"] == len(gguf_bytes)
    assert any(r["authorization"] == "Bearer hf_SECRET" for r in hub.behaviour.requests)
    assert find(source, [weights_dir]) == fetch.path
    report = scan([source], [weights_dir], [Mount("/", "ext4")])
    assert report["sources"][source]["path"] == str(fetch.path)

    manager.forget("r1")
    before = len(hub.behaviour.requests)
    again = manager.ensure("r1", source, [weights_dir])
    assert again.state == "done" and len(hub.behaviour.requests) == before


def test_an_hf_file_that_is_not_there_fails_with_the_reason(
        hub: LoopbackServer, manager: FetchManager, weights_dir: Path) -> None:
    hub.behaviour.repos["Org/Repo"] = HubRepo(COMMIT, {"a.gguf": b"a"})
    fetch = finished(manager.ensure("r1", "hf://Org/Repo/b.gguf", [weights_dir],
                                    token="hf_SECRET"))
    assert fetch.state == "failed"
    error = fetch.error or ""
    assert "hf://Org/Repo/b.gguf" in error and "b.gguf is not in Org/Repo" in error
    assert "404" in error and hub.url in error and "hf_SECRET" not in error
    missing_repo = finished(manager.ensure("r2", "hf://Org/Nope/b.gguf", [weights_dir]))
    assert "repository Org/Nope was not found" in (missing_repo.error or "")


def test_a_whole_hf_repo_downloads_as_a_complete_snapshot(
        hub: LoopbackServer, manager: FetchManager, weights_dir: Path) -> None:
    index = (b'{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",'
             b' "b": "model-00002-of-00002.safetensors"}}')
    files = {"config.json": b"{}", "model.safetensors.index.json": index,
             "model-00001-of-00002.safetensors": b"1" * 70_000,
             "model-00002-of-00002.safetensors": b"2" * 50_000}
    hub.behaviour.repos["Org/Sharded"] = HubRepo(COMMIT, files)
    fetch = finished(manager.ensure("r1", "hf://Org/Sharded", [weights_dir]))
    assert fetch.state == "done", fetch.error
    snap = weights_dir / "models--Org--Sharded" / "snapshots" / COMMIT
    assert fetch.path == snap and complete(snap) is None
    assert {p.name for p in snap.iterdir()} == set(files)
    assert fetch.progress()["total"] == sum(len(d) for d in files.values())
    assert find("hf://Org/Sharded", [weights_dir]) == snap

    (snap / "model-00002-of-00002.safetensors").unlink()      # as if cut short
    assert find("hf://Org/Sharded", [weights_dir]) is None


def test_an_hf_download_reports_progress_and_can_be_cancelled(
        hub: LoopbackServer, manager: FetchManager, weights_dir: Path,
        gguf_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    # huggingface_hub writes in 10 MB chunks; smaller ones let a small file show progress
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 16384)
    hub.behaviour.repos["Org/Slow"] = HubRepo(COMMIT, {"slow.gguf": gguf_bytes})
    hub.behaviour.delay_s = 0.02
    fetch = manager.ensure("r1", "hf://Org/Slow/slow.gguf", [weights_dir])
    for _ in range(500):
        if fetch.progress()["bytes"] >= 50_000:
            break
        fetch.wait(0.01)
    progress = fetch.progress()
    assert fetch.state == "fetching" and progress["total"] == len(gguf_bytes)
    assert 50_000 <= progress["bytes"] < len(gguf_bytes)
    manager.cancel("r1")
    finished(fetch)
    assert fetch.state == "failed" and "cancelled" in (fetch.error or "")
    assert find("hf://Org/Slow/slow.gguf", [weights_dir]) is None
