"""The replicated store's members as Patroni's REST API tells them: role, state, lag, and
a member that stopped or stopped answering shown as missing; and its etcd voters (Patroni's
leader key lives there), each healthy or not by etcd's own answers.

``GET /cluster`` on any member lists them all, but a member killed with ``kill -9`` keeps
its last state there for up to Patroni's ttl; so each member's own ``GET /patroni`` is
probed too, and one that does not answer is missing whatever ``/cluster`` says.
:func:`members_of` is pure (the answers in, the rows out); :class:`StoreHealth` asks, in
parallel with short timeouts, and keeps the answer a few seconds so that ``ctl status``,
the console and each Prometheus scrape do not each ask again.

etcd: the member list (``POST /v3/cluster/member/list``) names every voter, a voter that
never started too (it has published no client URL yet); each voter is healthy when its
own ``GET /health`` says so, asked at its client URLs and at the configured ones
(``LLMGW_ETCD_URLS``, which ``server init`` writes: the witness's own on 127.0.0.1),
matched to a member by ``POST /v3/maintenance/status``. :func:`etcd_voters` is pure.
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


def etcd_urls(configured: str) -> list[str]:
    """``LLMGW_ETCD_URLS`` (comma-separated client URLs), without trailing slashes."""
    return [u.strip().rstrip("/") for u in configured.split(",") if u.strip()]


def post_json(url: str, timeout: float) -> Answer:
    """etcd's v3 JSON gateway: POST ``{}`` to ``url``; its JSON, or why not."""
    request = urllib.request.Request(url, data=b"{}", method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        return str(reason) or type(exc).__name__


def etcd_voters(member_lists: dict[str, Answer], statuses: dict[str, Answer],
                health: dict[str, Answer], configured: list[str]) -> list[dict[str, Any]]:
    """One row per etcd voter, sorted by name: ``name``, ``client_urls``, ``healthy`` and
    the ``problem`` in words (None when healthy).

    ``member_lists``: each asked URL's member list (the first that answered is used);
    ``statuses``: each URL's maintenance status (which member answers there);
    ``health``: each URL's ``/health``. Without any member list, each configured URL is a
    row of its own."""
    listed = next((a for a in member_lists.values() if isinstance(a, dict)), None)
    owner = {url: str((a.get("header") or {}).get("member_id"))
             for url, a in statuses.items() if isinstance(a, dict)}

    def verdict(urls: list[str]) -> tuple[bool, str | None]:
        answers = [health.get(u) for u in urls if u in health]
        if any(isinstance(a, dict) and str(a.get("health")) == "true" for a in answers):
            return True, None
        said = next((a for a in answers if isinstance(a, dict)), None)
        if said is not None:
            return False, f"unhealthy: {said.get('reason') or said}"
        why = next((a for a in answers if isinstance(a, str)), "not asked")
        return False, f"does not answer: {why}"

    rows = []
    if listed is None:
        for url in configured:
            ok, problem = verdict([url])
            why = next((a for a in member_lists.values() if isinstance(a, str)), None)
            rows.append({"name": urlsplit(url).hostname or url, "client_urls": [url],
                         "healthy": ok, "problem": problem if ok or why is None
                         else f"{problem} (member list: {why})"})
        return sorted(rows, key=lambda r: r["name"])
    for m in listed.get("members") or []:
        member_id = str(m.get("ID"))
        clients = [str(u).rstrip("/") for u in m.get("clientURLs") or []]
        peers = [str(u) for u in m.get("peerURLs") or []]
        if not clients:        # a voter publishes its client URLs when it first starts
            rows.append({"name": str(m.get("name") or ", ".join(peers) or member_id),
                         "client_urls": [], "healthy": False,
                         "problem": "never started: it is in the member list but has not "
                                    "run yet (see `journalctl -u etcd` on that voter)"})
            continue
        urls = clients + [u for u, who in owner.items() if who == member_id]
        ok, problem = verdict(urls)
        rows.append({"name": str(m.get("name")), "client_urls": clients, "healthy": ok,
                     "problem": problem})
    return sorted(rows, key=lambda r: r["name"])


class StoreHealth:
    """The members of the replicated store (and its etcd voters), asked at most every
    ``ttl_s`` seconds."""

    def __init__(self, urls: list[str], timeout_s: float = 1.0, ttl_s: float = 5.0,
                 fetch: Callable[[str, float], Answer] = get_json,
                 clock: Callable[[], float] = time.monotonic,
                 etcd: list[str] | None = None,
                 post: Callable[[str, float], Answer] = post_json) -> None:
        self.urls = urls
        self.etcd = list(etcd or [])
        self._post = post
        self._etcd_cached: tuple[float, list[dict[str, Any]]] | None = None
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

    def voters(self) -> list[dict[str, Any]] | None:
        """The rows of :func:`etcd_voters`; None when no etcd URL is configured."""
        if not self.etcd:
            return None
        with self._lock:
            if self._etcd_cached and self._clock() - self._etcd_cached[0] < self._ttl:
                return self._etcd_cached[1]
            rows = self._ask_etcd()
            self._etcd_cached = (self._clock(), rows)
            return rows

    def _ask_etcd(self) -> list[dict[str, Any]]:
        timeout = self._timeout
        with ThreadPoolExecutor(max_workers=min(8, 3 * len(self.etcd))) as pool:
            lists = dict(zip(self.etcd, pool.map(
                lambda u: self._post(u + "/v3/cluster/member/list", timeout), self.etcd),
                strict=True))
            urls = set(self.etcd)
            for answer in lists.values():
                if isinstance(answer, dict):
                    urls |= {str(c).rstrip("/") for m in answer.get("members") or []
                             for c in m.get("clientURLs") or []}
            order = sorted(urls)
            statuses = dict(zip(order, pool.map(
                lambda u: self._post(u + "/v3/maintenance/status", timeout), order),
                strict=True))
            health = dict(zip(order, pool.map(
                lambda u: self._fetch(u + "/health", timeout), order), strict=True))
        return etcd_voters(lists, statuses, health, self.etcd)
