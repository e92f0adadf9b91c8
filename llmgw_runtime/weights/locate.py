"""Where a source's weights would sit in the weights directories, and whether what sits there is
complete. A half-finished download, an empty file or directory, or a sharded checkpoint with a
shard missing is never weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import EngineError
from .safepath import PARTIAL_SUFFIXES  # a partial download's name: never weights
from .sources import Source, parse_source

WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth")
INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json")


def hf_cache_folder(org: str, repo: str) -> str:
    """The folder huggingface_hub gives a model repo in its cache."""
    return f"models--{org}--{repo}"


def _snapshots(base: Path, org: str, repo: str) -> list[Path]:
    """Snapshot folders of ``org/repo`` in an HF cache at ``base``: the ones a ref (``main``
    first) points to, then the rest by name."""
    folder = base / hf_cache_folder(org, repo)
    try:
        names = sorted(p.name for p in (folder / "snapshots").iterdir() if p.is_dir())
    except OSError:
        return []
    preferred: list[str] = []
    try:
        refs = sorted((folder / "refs").iterdir(), key=lambda p: (p.name != "main", p.name))
    except OSError:
        refs = []
    for ref in refs:
        try:
            commit = ref.read_text(encoding="utf-8").strip()
        except OSError:
            continue
        if commit in names and commit not in preferred:
            preferred.append(commit)
    ordered = preferred + [n for n in names if n not in preferred]
    return [folder / "snapshots" / n for n in ordered]


def candidates_for(src: Source, dirs: Sequence[str | Path]) -> list[Path]:
    """:func:`candidates` for an already parsed source."""
    if src.kind == "file":
        assert src.path is not None
        return [src.path]
    out: list[Path] = []
    for d in dirs:
        base = Path(d).expanduser()
        if src.kind == "http":
            out.append(base / src.name)
            continue
        caches = [base, base / "hub"]
        if src.filename is not None:
            out += [base / src.org / src.repo / src.filename, base / src.filename,
                    base / Path(src.filename).name]
            out += [snap / src.filename
                    for c in caches for snap in _snapshots(c, src.org, src.repo)]
        else:
            out += [base / src.org / src.repo, base / src.repo]
            out += [snap for c in caches for snap in _snapshots(c, src.org, src.repo)]
    return list(dict.fromkeys(out))


def candidates(source: str, dirs: Sequence[str | Path]) -> list[Path]:
    """Every place, in order of preference, where the weights of ``source`` may sit."""
    return candidates_for(parse_source(source), dirs)


def _is_partial(name: str) -> bool:
    return name.endswith(PARTIAL_SUFFIXES)


def _partial_reason(path: Path) -> str | None:
    """Why ``path`` (or the file its link points to) is a partial download, if it is one."""
    for name in (path.name, os.path.basename(os.path.realpath(path))):
        if _is_partial(name):
            return f"{path} is a partial download ({name})"
    return None


def _complete_file(path: Path, st: os.stat_result) -> str | None:
    if st.st_size == 0:
        return f"{path} is empty (0 bytes)"
    if not os.access(path, os.R_OK):
        return f"{path} is not readable by this process"
    return None


def _check_index(index: Path) -> str | None:
    """A sharded checkpoint's index: every shard in its ``weight_map`` present and non-empty."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        shards = sorted(set(data["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{index} cannot be read as a checkpoint index: {exc}"
    for shard in shards:
        target = index.parent / str(shard)
        try:
            if target.stat().st_size == 0:
                return f"shard {shard} listed in {index.name} is empty (0 bytes)"
        except OSError:
            return f"shard {shard} listed in {index.name} is missing"
    return None


def _check_hf_tree(path: Path) -> str | None:
    """In an HF cache snapshot, every file of the cached tree listing must be there."""
    if path.parent.name != "snapshots" or not path.parent.parent.name.startswith("models--"):
        return None
    tree = path.parent.parent / "trees" / f"{path.name}.json"
    try:
        files = json.loads(tree.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no listing (a single-file download): nothing more to check
    missing = [f for f in files if not (path / f).exists()]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return f"{path} is an unfinished snapshot: {missing[0]}{more} missing"
    return None


def _complete_dir(path: Path) -> str | None:
    if not os.access(path, os.R_OK | os.X_OK):
        return f"{path} is not readable by this process"
    files: list[Path] = []
    for root, _dirs, names in os.walk(path):
        files += [Path(root) / n for n in names]
    if not files:
        return f"{path} is an empty directory"
    weights = 0
    for f in files:
        reason = _partial_reason(f)
        if reason is not None:
            return f"{path} holds a partial download ({f.relative_to(path)})"
        try:
            st = f.stat()
        except OSError:
            return f"{path} holds a broken link or unreadable file ({f.relative_to(path)})"
        if f.name.endswith(WEIGHT_SUFFIXES):
            if st.st_size == 0:
                return f"{path} holds an empty weight file ({f.relative_to(path)})"
            weights += 1
    if weights == 0:
        return f"{path} holds no weight file ({', '.join(WEIGHT_SUFFIXES)})"
    for f in files:
        if f.name.endswith(INDEX_SUFFIXES):
            reason = _check_index(f)
            if reason is not None:
                return f"{path}: {reason}"
    return _check_hf_tree(path)


def complete(path: str | Path) -> str | None:
    """None when ``path`` is usable weights, else why not, in plain words.

    A link counts when its target is complete (HF cache snapshots are links to blobs).
    """
    path = Path(path)
    if not os.path.lexists(path):
        return f"{path} does not exist"
    reason = _partial_reason(path)
    if reason is not None:
        return reason
    try:
        st = path.stat()
    except OSError as exc:
        if path.is_symlink():
            return f"{path} is a broken link to {os.readlink(path)}"
        return f"{path} cannot be read: {exc.strerror or exc}"
    if path.is_dir():
        return _complete_dir(path)
    if not path.is_file():
        return f"{path} is not a regular file or directory"
    return _complete_file(path, st)


def find_for(src: Source, dirs: Sequence[str | Path]) -> Path | None:
    """:func:`find` for an already parsed source."""
    for candidate in candidates_for(src, dirs):
        if complete(candidate) is None:
            return candidate
    return None


def find(source: str, dirs: Sequence[str | Path]) -> Path | None:
    """The first complete candidate for ``source``, or None."""
    return find_for(parse_source(source), dirs)


def resolve(source: str, dirs: Sequence[str | Path], *, check_files: bool = True) -> Path:
    """Where the weights of ``source`` are on this node, or EngineError saying why not.

    File sources are the path itself; with ``check_files`` they must be complete too
    (without it they are returned as they are, and the engine reports a bad path).
    """
    src = parse_source(source)
    if src.kind == "file":
        assert src.path is not None
        reason = complete(src.path) if check_files else None
        if reason is not None:
            raise EngineError(f"source {source!r}: {reason}")
        return src.path
    found = find_for(src, dirs)
    if found is not None:
        return found
    looked = ", ".join(str(d) for d in dirs) or "no directories (none configured)"
    seen = ""
    for candidate in candidates_for(src, dirs):
        if os.path.lexists(candidate):
            seen = f" ({complete(candidate)})"
            break
    raise EngineError(
        f"source {src.display!r}: {src.name} was not found in the weights directories "
        f"({looked}){seen}; download it into one of them, or set LLMGW_WEIGHTS_DIRS to the "
        "directory that holds it")
