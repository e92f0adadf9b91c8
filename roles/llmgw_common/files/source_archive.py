"""Write llmgw's source archive (an sdist pip builds on each host): ``DEST/llmgw-<version>.tar.gz``.

Run on the controller by ``tasks/install.yml``. The hosts build the wheel themselves, so the
compiled relay loop (setup.py) is built for each host's architecture and Python. The archive
is reproducible (sorted entries, fixed times, owners and modes, no gzip time stamp) and left
untouched when its bytes would not change: hosts get a new copy only when the source did.
Prints the archive's path.

    source_archive.py SOURCE_DIR DEST_DIR
"""

from __future__ import annotations

import gzip
import io
import os
import sys
import tarfile
import tomllib
from pathlib import Path

TOP = ("pyproject.toml", "setup.py")
PACKAGE = "llmgw_runtime"
SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".c")     # built here, never shipped


def members(source: Path) -> list[Path]:
    files = [source / name for name in TOP]
    for path in sorted((source / PACKAGE).rglob("*")):
        rel = path.relative_to(source)
        if path.is_file() and not SKIP_DIRS & set(rel.parts) \
                and not path.name.endswith(SKIP_SUFFIXES):
            files.append(path)
    return files


def archive(source: Path, version: str) -> bytes:
    root = f"llmgw-{version}"
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in members(source):
            info = tarfile.TarInfo(f"{root}/{path.relative_to(source).as_posix()}")
            data = path.read_bytes()
            info.size, info.mtime, info.uid, info.gid = len(data), 315532800, 0, 0
            info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def main(argv: list[str]) -> int:
    source, dest = Path(argv[1]).resolve(), Path(argv[2])
    version = tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"]
    data = archive(source, version)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"llmgw-{version}.tar.gz"
    if not target.is_file() or target.read_bytes() != data:
        # atomic: Molecule scenarios run side by side and read the archive another one may
        # be writing (molecule/run-all.sh)
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        partial.write_bytes(data)
        os.replace(partial, target)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
