"""Which llama.cpp build a node has: the ``llama-server`` binary's version, where it came from
and whether it can take part in a multi-node replica (RPC).

llama.cpp names its RPC worker ``ggml-rpc-server`` in recent versions and ``rpc-server`` in
older ones; both are looked for next to ``llama-server`` and on PATH. A build made by
``scripts/build-llama-cpp.sh`` (``make llama-cpp``) or by the Ansible engines role with
``llmgw_engines_llama_cpp_build`` has a ``build-info.json`` beside its ``bin/`` directory
(or in it) naming the pinned source, the llama.cpp commit that source vendors and its cmake
flags; ``llama-server --version`` alone says only ``version: 0.5.0-dev (build 0, commit
unknown)`` for such a build (the sdist has no git history for cmake to read). A build
recorded before the commit was (no ``llama_cpp_commit``) gets it from the pin,
``scripts/llama-cpp.pin``, when it was built from the pinned version.
"""

from __future__ import annotations

import json
import mmap
import os
import shlex
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RPC_SERVER_NAMES = ("ggml-rpc-server", "rpc-server")
BUILD_INFO = "build-info.json"
# The one pin (version, sha256, the llama.cpp commit it vendors, cmake flags), in a checkout.
PIN = Path(__file__).resolve().parents[2] / "scripts" / "llama-cpp.pin"
COMMIT_SHOWN = 9                        # as llama.cpp's own changelogs abbreviate it
BUILD_HINT = ("build one with `make llama-cpp` (scripts/build-llama-cpp.sh) or the Ansible "
              "engines role's llmgw_engines_llama_cpp_build")
# Text only llama.cpp's RPC backend (ggml-rpc.cpp) carries: in the binary of a static build,
# in libggml-rpc.so next to it for a shared one.
_RPC_MARK = b"Remote RPC server crashed or returned malformed response"


def executable(path: str | os.PathLike[str]) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def find_rpc_server(llama_server: str | None, configured: str | None = None) -> str | None:
    """llama.cpp's RPC worker: ``configured`` (a path or a name on PATH) and nothing else when
    set; else one of RPC_SERVER_NAMES next to ``llama_server``, else on PATH. None when
    there is none."""
    if configured:
        candidates = [configured]
    else:
        found = (shutil.which(llama_server) or llama_server) if llama_server else None
        candidates = [str(Path(found).with_name(n)) for n in RPC_SERVER_NAMES] if found else []
        candidates += list(RPC_SERVER_NAMES)
    for candidate in candidates:
        path = shutil.which(candidate) or candidate
        if executable(path):
            return path
    return None


@dataclass(frozen=True)
class LlamaCppBuild:
    """What ``inspect`` found about one ``llama-server``."""

    binary: str
    version: str | None = None          # llama.cpp's own `--version` line
    source: str | None = None           # "llama-cpp-python 0.3.36" from build-info.json
    llama_cpp_commit: str | None = None  # the llama.cpp commit that source vendors
    cmake_flags: str | None = None
    rpc: bool | None = None             # the RPC backend is built in (None: cannot tell)
    rpc_server: str | None = None       # the RPC worker found for it
    problem: str | None = None          # why it cannot run

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line for the doctor."""
        what = self.binary if self.binary.startswith("xllamacpp") else \
            f"llama-server {self.binary}"
        if self.problem:
            return f"{what}: {self.problem}"
        parts = [f"{what}: {self.version or 'version unknown'}"]
        if self.source:
            built = f"built from {self.source}"
            if self.llama_cpp_commit:
                built += f", llama.cpp commit {self.llama_cpp_commit[:COMMIT_SHOWN]}"
                if "commit unknown" in (self.version or ""):
                    built += " (the binary does not know its own commit)"
            parts.append(built)
        if self.rpc is None:
            parts.append("RPC support unknown")
        elif not self.rpc:
            parts.append("no RPC: single-node replicas only (a multi-node llama.cpp replica "
                         "cannot use this node)")
        elif self.rpc_server:
            parts.append(f"RPC: yes, worker {self.rpc_server}")
        else:
            parts.append(f"RPC: yes, but no RPC worker ({' or '.join(RPC_SERVER_NAMES)}) "
                         "next to it or on PATH: this node can only be a multi-node head")
        return "; ".join(parts)


def _build_info(binary: Path) -> dict[str, Any] | None:
    for where in (binary.parent, binary.parent.parent):
        path = where / BUILD_INFO
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def read_pin(path: Path = PIN) -> dict[str, str]:
    """The pin's ``KEY=VALUE`` lines (empty when there is no checkout next to llmgw)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and not line.startswith("#"):
            out[key.strip()] = " ".join(shlex.split(value))
    return out


def vendored_commit(info: dict[str, Any], pin: dict[str, str]) -> str | None:
    """The llama.cpp commit of a build: its build-info.json's, else the pin's when the build
    is of the pinned llama-cpp-python version (a record older than the field)."""
    commit = info.get("llama_cpp_commit")
    if isinstance(commit, str) and commit:
        return commit
    if info.get("source") == "llama-cpp-python" and info.get("version") and \
            info.get("version") == pin.get("LLAMA_CPP_PY_VERSION"):
        return pin.get("LLAMA_CPP_COMMIT") or None
    return None


def _contains(path: Path, needle: bytes) -> bool:
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return mm.find(needle) >= 0
    except (OSError, ValueError):
        return False


def _has_rpc_backend(binary: Path) -> bool:
    libs = [binary, *binary.parent.glob("libggml-rpc*.so*"),
            *binary.parent.parent.glob("lib/libggml-rpc*.so*")]
    return any(_contains(p, _RPC_MARK) for p in libs)


def _version(binary: Path, timeout: float) -> tuple[str | None, str | None]:
    """(the `version:` line of `llama-server --version`, or a problem)."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"`{binary} --version` could not run: {exc}"
    text = (done.stdout or "") + (done.stderr or "")
    line = next((ln.strip() for ln in text.splitlines() if ln.startswith("version:")), None)
    if done.returncode != 0 and line is None:
        last = text.strip().splitlines()[-1:] or ["no output"]
        return None, f"`{binary} --version` exited {done.returncode}: {last[0]}"
    return line, None


def inspect(llama_server: str, rpc_binary: str | None = None,
            timeout: float = 10.0) -> LlamaCppBuild:
    """Version, source, RPC support and RPC worker of the ``llama-server`` at
    ``llama_server`` (a path or a name on PATH)."""
    found = shutil.which(llama_server) or llama_server
    if not executable(found):
        return LlamaCppBuild(binary=llama_server, problem="not found or not executable; "
                             f"fix LLMGW_LLAMA_SERVER_BINARY or {BUILD_HINT}")
    binary = Path(found).resolve()
    version, problem = _version(binary, timeout)
    info = _build_info(binary) or {}
    source = (f"{info.get('source', 'source')} {info['version']}"
              if info.get("version") else None)
    rpc = info.get("rpc") if isinstance(info.get("rpc"), bool) else _has_rpc_backend(binary)
    return LlamaCppBuild(binary=str(found), version=version, source=source,
                         llama_cpp_commit=vendored_commit(info, read_pin()),
                         cmake_flags=info.get("cmake_flags"), rpc=rpc,
                         rpc_server=find_rpc_server(str(found), rpc_binary),
                         problem=problem)


def cpu_engine() -> LlamaCppBuild | None:
    """The CPU engine (the xllamacpp wheel), when installed: llama.cpp without RPC."""
    from importlib import metadata

    try:
        version = metadata.version("xllamacpp")
    except metadata.PackageNotFoundError:
        return None
    return LlamaCppBuild(binary="xllamacpp (the CPU engine)", version=f"xllamacpp {version}",
                         rpc=False)
