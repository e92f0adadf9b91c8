"""Catalog model sources, parsed: a local file, an HTTP(S) URL, or a Hugging Face repo or file."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse, urlunparse

from ..errors import EngineError
from .safepath import component_problem, name_problem

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


def _shown(text: str, limit: int = 120) -> str:
    """``repr(text)``, cut in the middle when long, for a message."""
    if len(text) > limit:
        text = text[: limit // 2] + "..." + text[-limit // 4:]
    return repr(text)


def parse_source(source: str) -> Source:
    """Parse a catalog source; EngineError naming the source and the accepted forms if bad.

    What becomes a path in a weights directory must be safe there: an http(s) file name
    (URL-decoded) is one plain path component (safepath.name_problem), and every part of an
    hf:// source is one path component (the file may sit in folders of the repo: ``a/b.gguf``,
    never ``..``).
    """
    try:
        return _parse(source)
    except ValueError as exc:   # urlparse: e.g. an unclosed [ in the host
        raise EngineError(f"source {_shown(source)} is not a valid URL ({exc}); write "
                          "https://host/path/model.gguf") from None


def _parse(source: str) -> Source:
    if source.startswith("file://"):
        parsed = urlparse(source)
        path = unquote(parsed.path)
        if parsed.netloc not in ("", "localhost") or not path.startswith("/"):
            raise EngineError(f"source {_shown(source)} is not an absolute file URL; "
                              "write file:///absolute/path/model.gguf")
        return Source(raw=source, kind="file", path=Path(path))
    if source.startswith("/"):
        return Source(raw=source, kind="file", path=Path(source))
    if source.startswith(("https://", "http://")):
        parsed = urlparse(source)
        name = unquote(posixpath.basename(parsed.path))
        shown = _shown(redact_url(source))
        if not parsed.netloc or not name or name in (".", ".."):
            raise EngineError(f"source {shown} has no file name at the end of its URL path; "
                              "write https://host/path/model.gguf")
        problem = name_problem(name)
        if problem is not None:
            raise EngineError(f"source {shown}: the file name at the end of its URL path, "
                              f"{_shown(name, 60)} once decoded, {problem}; it would be "
                              "written there in the weights directory: end the URL with a "
                              "plain name like model.gguf")
        return Source(raw=source, kind="http", url=source, name=name)
    if source.startswith("hf://"):
        parts = source[len("hf://"):].strip("/").split("/")
        if len(parts) < 2 or not all(parts):
            raise EngineError(f"source {_shown(source)} must be hf://org/repo/file or "
                              f"hf://org/repo (e.g. {HF_EXAMPLE})")
        for part in parts:
            problem = component_problem(part)
            if problem is not None:
                raise EngineError(f"source {_shown(source)}: the part {_shown(part, 60)} "
                                  f"{problem}; each part of hf://org/repo/path/file is one "
                                  f"plain name (e.g. {HF_EXAMPLE})")
        filename = "/".join(parts[2:]) or None
        return Source(raw=source, kind="hf", org=parts[0], repo=parts[1], filename=filename,
                      name=parts[-1])
    raise EngineError(f"source {_shown(source)} is not supported on this node; use "
                      "file:///absolute/path, an absolute path, https://host/path/file, "
                      "or hf://org/repo[/file]")
