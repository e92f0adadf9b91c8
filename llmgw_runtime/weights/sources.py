"""Catalog model sources, parsed: a local file, an HTTP(S) URL, or a Hugging Face repo or file."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse, urlunparse

from ..errors import EngineError

HF_EXAMPLE = "hf://Qwen/Qwen2.5-7B-Instruct-GGUF/qwen2.5-7b-instruct-q4_k_m.gguf"


@dataclass(frozen=True)
class Source:
    """A parsed source. ``kind`` is ``file``, ``http`` or ``hf``.

    file: ``path``; http: ``url`` and ``name`` (the URL path's last part); hf: ``org``,
    ``repo`` and ``filename`` (the path inside the repo, None for a whole repo).
    """

    raw: str
    kind: str
    path: Path | None = None
    url: str = ""
    name: str = ""
    org: str = ""
    repo: str = ""
    filename: str | None = None

    @property
    def repo_id(self) -> str:
        return f"{self.org}/{self.repo}"

    @property
    def display(self) -> str:
        """The source as it may appear in logs and errors (no query string, no password)."""
        return redact_url(self.raw) if self.kind == "http" else self.raw


def redact_url(url: str) -> str:
    """``url`` without query, fragment or user info: those are where secrets hide."""
    parsed = urlparse(url)
    netloc = parsed.netloc.rpartition("@")[2]
    return urlunparse((parsed.scheme, netloc, parsed.path, "", "", ""))


def parse_source(source: str) -> Source:
    """Parse a catalog source; EngineError naming the source and the accepted forms if bad."""
    if source.startswith("file://"):
        parsed = urlparse(source)
        path = unquote(parsed.path)
        if parsed.netloc not in ("", "localhost") or not path.startswith("/"):
            raise EngineError(f"source {source!r} is not an absolute file URL; "
                              "write file:///absolute/path/model.gguf")
        return Source(raw=source, kind="file", path=Path(path))
    if source.startswith("/"):
        return Source(raw=source, kind="file", path=Path(source))
    if source.startswith(("https://", "http://")):
        parsed = urlparse(source)
        name = unquote(posixpath.basename(parsed.path))
        if not parsed.netloc or not name or name in (".", ".."):
            raise EngineError(f"source {redact_url(source)!r} has no file name at the end of "
                              "its URL path; write https://host/path/model.gguf")
        return Source(raw=source, kind="http", url=source, name=name)
    if source.startswith("hf://"):
        parts = source[len("hf://"):].strip("/").split("/")
        if len(parts) < 2 or not all(parts) or any(p in (".", "..") for p in parts):
            raise EngineError(f"source {source!r} must be hf://org/repo/file or hf://org/repo "
                              f"(e.g. {HF_EXAMPLE})")
        filename = "/".join(parts[2:]) or None
        return Source(raw=source, kind="hf", org=parts[0], repo=parts[1], filename=filename,
                      name=parts[-1])
    raise EngineError(f"source {source!r} is not supported on this node; use "
                      "file:///absolute/path, an absolute path, https://host/path/file, "
                      "or hf://org/repo[/file]")
