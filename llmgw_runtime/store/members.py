"""The replicated store's members as Patroni's REST API tells them: role, state, lag, and
a member that stopped or stopped answering shown as missing.

``GET /cluster`` on any member lists them all, but a member killed with ``kill -9`` keeps
its last state there for up to Patroni's ttl; so each member's own ``GET /patroni`` is
probed too, and one that does not answer is missing whatever ``/cluster`` says.
:func:`members_of` is pure (the answers in, the rows out); :class:`StoreHealth` asks, in
parallel with short timeouts, and keeps the answer a few seconds so that ``ctl status``,
the console and each Prometheus scrape do not each ask again.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote, urlsplit

Answer = dict[str, Any] | str          # a JSON answer, or why there is none

DEFAULT_REST_PORT = 8008


def patroni_urls(configured: str, database_url: str,
                 rest_port: int = DEFAULT_REST_PORT) -> list[str]:
    """The Patroni REST APIs to ask: ``LLMGW_PATRONI_URLS`` (comma-separated) when set;
    else, for a PostgreSQL URL naming several hosts, ``http://HOST:8008`` for each; else
    none (SQLite, or one database server without Patroni)."""
    if configured.strip():
        return [u.strip().rstrip("/") for u in configured.split(",") if u.strip()]
    hosts = database_hosts(database_url)
    if len(hosts) < 2:
        return []
    return [rest_url(h, rest_port) for h in hosts]


def rest_url(host: str, port: int = DEFAULT_REST_PORT) -> str:
    """``http://HOST:PORT`` of a member's Patroni REST API (an IPv6 address bracketed)."""
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def database_hosts(url: str) -> list[str]:
    """The hosts of a ``postgresql://user:pw@h1:5432,h2:5432/db`` URL, or its ``host=``
    parameter (``?host=h1,h2``); none for any other URL."""
    if not url.startswith(("postgresql:", "postgres:", "postgresql+psycopg2:")):
        return []
    rest = url.split("://", 1)[1]
    netloc = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    query = urlsplit("x://x/" + rest.split("/", 1)[1]).query if "/" in rest else ""
    params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
    if "host" in params:
        return [h for h in unquote(params["host"]).split(",") if h and not h.startswith("/")]
    hosts = []
    for spot in netloc.split(","):
        if spot.startswith("["):
            hosts.append(spot[1:spot.index("]")])
        elif spot:
            hosts.append(spot.split(":", 1)[0])
    return [h for h in hosts if h]


def _base(api_url: str) -> str:
    """``http://10.0.0.1:8008/patroni`` -> ``http://10.0.0.1:8008``."""
    parts = urlsplit(api_url)
    return f"{parts.scheme}://{parts.netloc}"


def members_of(cluster: dict[str, Answer], probes: dict[str, Answer],
               urls: list[str]) -> list[dict[str, Any]]:
    """One row per member, sorted by name: ``name``, ``api_url``, ``role`` (leader,
    sync_standby, replica), ``state``, ``lag_bytes`` (null when unknown), ``missing`` and
    the ``problem`` in words.

    ``cluster``: each configured URL's ``GET /cluster`` answer; the freshest view that
    answered is used (the one naming a leader, else any). ``probes``: each member base
    URL's own ``GET /patroni`` answer. A configured URL that no view names is a member
    too: missing, named by its address."""
    views = [v for v in cluster.values() if isinstance(v, dict)]
    view = next((v for v in views if any(m.get("role") == "leader"
                                         for m in v.get("members", []))),
                views[0] if views else {"members": []})
    rows: dict[str, dict[str, Any]] = {}
    for m in view.get("members", []):
        base = _base(m.get("api_url") or f"http://{m.get('host')}:{DEFAULT_REST_PORT}")
        lag = m.get("lag")
        row = {"name": str(m.get("name")), "api_url": base, "role": m.get("role"),
               "state": m.get("state"),
               "lag_bytes": lag if isinstance(lag, int) and not isinstance(lag, bool)
               else None,
               "missing": False, "problem": None}
        probe = probes.get(base)
        if isinstance(probe, str):
            row.update(missing=True, problem=f"its REST API does not answer: {probe}")
        elif row["state"] == "stopped" or (isinstance(probe, dict)
                                           and probe.get("state") == "stopped"):
            row.update(missing=True, problem="stopped: Patroni runs, PostgreSQL does not")
        elif row["role"] != "leader" and lag is not None and row["lag_bytes"] is None:
            row["problem"] = f"replication lag unknown ({lag})"
        rows[row["name"]] = row
    named = {r["api_url"] for r in rows.values()}
    for url in urls:
        why = cluster.get(url)
        if url in named or isinstance(why, dict):   # answered: a member under another name
            continue
        rows[url] = {"name": urlsplit(url).hostname or url, "api_url": url, "role": None,
                     "state": None, "lag_bytes": None, "missing": True,
                     "problem": f"its REST API does not answer: {why or 'not asked'}"}
    return sorted(rows.values(), key=lambda r: r["name"])


def get_json(url: str, timeout: float) -> Answer:
    """The JSON at ``url``, or why not (Patroni answers 503 with JSON on some paths)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        try:
            return json.loads(exc.read())  # type: ignore[no-any-return]
        except ValueError:
            return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return str(reason) or type(exc).__name__


class StoreHealth:
    """The members of the replicated store, asked at most every ``ttl_s`` seconds."""

    def __init__(self, urls: list[str], timeout_s: float = 1.0, ttl_s: float = 5.0,
                 fetch: Callable[[str, float], Answer] = get_json,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.urls = urls
        self._timeout = timeout_s
        self._ttl = ttl_s
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._cached: tuple[float, list[dict[str, Any]]] | None = None

    def members(self) -> list[dict[str, Any]] | None:
        """The rows of :func:`members_of`; None when the store is not replicated."""
        if not self.urls:
            return None
        with self._lock:
            if self._cached and self._clock() - self._cached[0] < self._ttl:
                return self._cached[1]
            rows = self._ask()
            self._cached = (self._clock(), rows)
            return rows

    def _ask(self) -> list[dict[str, Any]]:
        with ThreadPoolExecutor(max_workers=min(8, 2 * len(self.urls))) as pool:
            views = dict(zip(self.urls, pool.map(
                lambda u: self._fetch(u + "/cluster", self._timeout), self.urls), strict=True))
            bases = {_base(m.get("api_url") or "") for v in views.values()
                     if isinstance(v, dict) for m in v.get("members", []) if m.get("api_url")}
            bases |= set(self.urls)
            order = sorted(bases)
            probes = dict(zip(order, pool.map(
                lambda b: self._fetch(b + "/patroni", self._timeout), order), strict=True))
        return members_of(views, probes, self.urls)
