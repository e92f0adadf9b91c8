"""A real HTTP server on 127.0.0.1 for the download tests: plain files with Range support,
answers cut short, a server that ignores Range, wrong content, 404s, throttling, and a fake
of the Hugging Face Hub's resolve / revision / tree endpoints."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"bytes=(\d+)-$")
_RESOLVE = re.compile(r"^/([^/]+)/([^/]+)/resolve/([^/]+)/(.+)$")
_API = re.compile(r"^/api/models/([^/]+)/([^/]+)/(revision|tree)/([^/]+)$")


@dataclass
class HubRepo:
    sha: str
    files: dict[str, bytes]


@dataclass
class Behaviour:
    """What the server does; tests change it between requests."""

    files: dict[str, bytes] = field(default_factory=dict)      # path -> content
    cuts: dict[str, list[int]] = field(default_factory=dict)   # path -> per-request byte limits
    wrong: dict[str, bytes] = field(default_factory=dict)      # path -> content served instead
    ignore_range: bool = False
    delay_s: float = 0.0                                       # between 16 KiB chunks
    repos: dict[str, HubRepo] = field(default_factory=dict)    # "org/repo" -> repo
    requests: list[dict[str, Any]] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(head=True)

    def do_GET(self) -> None:
        self._answer(head=False)

    def _answer(self, head: bool) -> None:
        b = self.server.behaviour
        path = unquote(urlsplit(self.path).path)
        b.requests.append({"method": self.command, "path": path,
                           "range": self.headers.get("Range"),
                           "authorization": self.headers.get("Authorization")})
        if path.startswith("/api/"):
            self._api(path)
        elif _RESOLVE.match(path):
            self._resolve(path, head)
        elif path in b.files:
            self._file(path, b.wrong.get(path, b.files[path]), head, {})
        else:
            self._send(404, b"not found", head)

    def _send(self, status: int, body: bytes, head: bool,
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _file(self, path: str, data: bytes, head: bool, extra: dict[str, str]) -> None:
        b = self.server.behaviour
        start, status = 0, 200
        m = _RANGE.match(self.headers.get("Range") or "")
        headers = dict(extra, **{"Accept-Ranges": "bytes"})
        if m and not b.ignore_range:
            start = int(m.group(1))
            if start >= len(data):
                self._send(416, b"", head, {"Content-Range": f"bytes */{len(data)}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return
        limits = b.cuts.get(path)
        limit = limits.pop(0) if limits else len(body)
        sent = 0
        try:
            while sent < min(limit, len(body)):
                chunk = body[sent:min(sent + 16384, limit)]
                self.wfile.write(chunk)
                sent += len(chunk)
                if b.delay_s:
                    self.wfile.flush()
                    time.sleep(b.delay_s)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away (a cancelled download)
        self.close_connection = True

    def _resolve(self, path: str, head: bool) -> None:
        org, name, _rev, filename = _RESOLVE.match(path).groups()  # type: ignore[union-attr]
        repo = self.server.behaviour.repos.get(f"{org}/{name}")
        if repo is None:
            self._send(401, b"", head, {"X-Error-Code": "RepoNotFound"})
            return
        if filename not in repo.files:
            self._send(404, b"", head, {"X-Error-Code": "EntryNotFound",
                                        "X-Repo-Commit": repo.sha})
            return
        data = repo.files[filename]
        etag = hashlib.sha256(data).hexdigest()
        self._file(path, data, head, {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"'})

    def _api(self, path: str) -> None:
        m = _API.match(path)
        repo = self.server.behaviour.repos.get(f"{m.group(1)}/{m.group(2)}") if m else None
        if m is None or repo is None:
            self._send(401, b"{}", False, {"X-Error-Code": "RepoNotFound"})
            return
        if m.group(3) == "revision":
            doc: Any = {"id": f"{m.group(1)}/{m.group(2)}", "sha": repo.sha,
                        "siblings": [{"rfilename": f} for f in sorted(repo.files)]}
        else:
            doc = [{"type": "file", "path": f, "size": len(data),
                    "oid": hashlib.sha1(data).hexdigest()}  # noqa: S324 (git's blob id)
                   for f, data in sorted(repo.files.items())]
        self._send(200, json.dumps(doc).encode(), False,
                   {"Content-Type": "application/json", "X-Repo-Commit": repo.sha})


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.behaviour = Behaviour()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self._thread.join(5)

    def gets(self, path: str) -> list[dict[str, Any]]:
        """The GET requests made for ``path`` so far."""
        return [r for r in self.behaviour.requests if r["path"] == path and r["method"] == "GET"]
