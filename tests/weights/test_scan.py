from __future__ import annotations

import os
from pathlib import Path

import pytest

from llmgw_runtime.weights.mounts import Mount
from llmgw_runtime.weights.scan import Scanner, scan


def write(path: Path, data: bytes = b"weights") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@pytest.fixture
def node(tmp_path: Path) -> tuple[Path, Path, list[Mount]]:
    """A node with a local weights dir and a filer-backed one (NFSv4)."""
    local, filer = tmp_path / "local", tmp_path / "filer"
    local.mkdir()
    filer.mkdir()
    mounts = [Mount("/", "ext4"), Mount(os.path.realpath(filer), "nfs4")]
    return local, filer, mounts


def test_an_agent_with_no_weights_dirs_reports_nothing(tmp_path: Path) -> None:
    write(tmp_path / "m.gguf")
    assert scan([f"file://{tmp_path}/m.gguf"], [], [Mount("/", "ext4")]) == {}


def test_report_lists_dirs_with_their_filesystem_and_complete_sources_only(
        node: tuple[Path, Path, list[Mount]]) -> None:
    local, filer, mounts = node
    write(local / "q4.gguf")
    write(filer / "Org" / "Big" / "big.gguf")
    write(local / "half.gguf.part", b"half")
    write(filer / "empty.gguf", b"")
    missing = local.parent / "nowhere"
    sources = ["hf://Org/Repo/q4.gguf", "hf://Org/Big/big.gguf",
               "https://h.example/half.gguf", "hf://Org/X/empty.gguf", "hf://Org/Y/none.gguf",
               "not a source"]
    report = scan(sources, [str(local), str(filer), str(missing)], mounts)
    assert report["dirs"] == [
        {"path": str(local), "fstype": "ext4", "shared": False, "exists": True},
        {"path": str(filer), "fstype": "nfs4", "shared": True, "exists": True},
        {"path": str(missing), "fstype": "ext4", "shared": False, "exists": False},
    ]
    assert report["sources"] == {
        "hf://Org/Repo/q4.gguf": {"path": str(local / "q4.gguf"), "shared": False},
        "hf://Org/Big/big.gguf": {"path": str(filer / "Org/Big/big.gguf"), "shared": True},
    }


def test_unknown_filesystems_read_as_local(tmp_path: Path) -> None:
    write(tmp_path / "q4.gguf")
    mounts = [Mount("/", "ext4"), Mount(os.path.realpath(tmp_path), "fuse.mystery")]
    report = scan(["hf://Org/Repo/q4.gguf"], [tmp_path], mounts)
    assert report["dirs"][0]["fstype"] == "fuse.mystery"
    assert report["dirs"][0]["shared"] is False
    assert report["sources"]["hf://Org/Repo/q4.gguf"]["shared"] is False
    assert scan([], [tmp_path], [])["dirs"][0]["fstype"] == "unknown"


def test_a_file_source_counts_wherever_it_is_with_its_own_mount(
        node: tuple[Path, Path, list[Mount]]) -> None:
    local, filer, mounts = node
    outside = write(filer / "elsewhere" / "m.gguf")      # not in any weights dir
    empty = write(filer / "elsewhere" / "e.gguf", b"")
    report = scan([f"file://{outside}", str(empty), "/no/such/file.gguf"], [local], mounts)
    assert report["sources"] == {f"file://{outside}": {"path": str(outside), "shared": True}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_scanner_rescans_only_when_stale_or_when_the_sources_change(tmp_path: Path) -> None:
    clock = Clock()
    scanner = Scanner([tmp_path], interval_s=30, mounts=lambda: [Mount("/", "ext4")],
                      clock=clock)
    sources = ["hf://Org/Repo/q4.gguf"]
    assert scanner.scan(sources)["sources"] == {}
    write(tmp_path / "q4.gguf")
    clock.now += 10
    assert scanner.scan(sources)["sources"] == {} and scanner.scans == 1    # cached
    assert "hf://Org/Repo/q4.gguf" in scanner.scan(sources + ["hf://Org/R/b.gguf"])["sources"]
    assert scanner.scans == 2                                                # sources changed
    (tmp_path / "q4.gguf").unlink()
    clock.now += 29
    assert scanner.scan(sources + ["hf://Org/R/b.gguf"])["sources"] != {}
    clock.now += 1
    assert scanner.scan(sources + ["hf://Org/R/b.gguf"])["sources"] == {}   # interval passed
    write(tmp_path / "q4.gguf")
    scanner.invalidate()
    assert scanner.scan(["hf://Org/R/b.gguf", "hf://Org/Repo/q4.gguf"])["sources"] != {}
    assert scanner.scans == 4


def test_scanner_with_no_dirs_reports_nothing(tmp_path: Path) -> None:
    assert Scanner([], mounts=list).scan(["/x.gguf"]) == {}


def test_a_thousand_sources_scan_quickly(tmp_path: Path) -> None:
    import time

    for i in range(0, 1000, 10):
        write(tmp_path / f"m{i}.gguf")
    sources = [f"hf://Org/Repo{i}/m{i}.gguf" for i in range(1000)]
    started = time.monotonic()
    report = scan(sources, [tmp_path, tmp_path / "other"], [Mount("/", "ext4")])
    assert len(report["sources"]) == 100
    assert time.monotonic() - started < 2.0
