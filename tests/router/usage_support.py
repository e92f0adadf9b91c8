"""For the usage and limit tests: a stand-in control service that also takes the routers'
usage reports (checked with the real message, counted once per reporter and seq as the
control service does), and the real router started with any settings."""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

from fake_control import FakeControl
from harness import start_router, stop
from werkzeug.wrappers import Request, Response

from llmgw_runtime.api.usage import UsageReport

from .conftest import ROUTER_TOKEN


class UsageControl(FakeControl):
    """FakeControl that also answers ``POST /api/v1/usage``: each report parsed by
    ``api.usage.UsageReport``; one whose (reporter, seq) was seen is answered
    ``applied: false`` and not counted. While ``lose_answers`` is above 0, a report is
    applied and then answered 503 (its answer lost), and the count goes down."""

    def __init__(self, routes: dict[str, Any], token: str) -> None:
        self.reports: list[UsageReport] = []
        self.duplicates = 0
        self.lose_answers = 0
        self._seen: dict[str, int] = {}
        self._usage_lock = threading.Lock()
        super().__init__(routes, token)

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        req = Request(environ)
        if (req.method == "POST" and req.path == "/api/v1/usage"
                and req.headers.get("Authorization") == f"Bearer {self.token}"):
            report = UsageReport.model_validate_json(req.get_data())
            with self._usage_lock:
                applied = report.seq > self._seen.get(report.reporter, 0)
                if applied:
                    self._seen[report.reporter] = report.seq
                    self.reports.append(report)
                else:
                    self.duplicates += 1
                lost = applied and self.lose_answers > 0
                if lost:
                    self.lose_answers -= 1
            if lost:
                return Response(b'{"error": {"code": 503, "reason": "lost"}}', 503,
                                content_type="application/json")(environ, start_response)
            return Response(json.dumps({"applied": applied}), 200,
                            content_type="application/json")(environ, start_response)
        return super()._wsgi(environ, start_response)

    def totals(self) -> dict[tuple[str, str], tuple[int, int, int]]:
        """(key hash, model) -> (requests, prompt tokens, completion tokens) so far."""
        out: Counter[tuple[str, str, str]] = Counter()
        with self._usage_lock:
            for report in self.reports:
                for e in report.entries:
                    out[(e.key, e.model, "r")] += e.requests
                    out[(e.key, e.model, "p")] += e.prompt_tokens
                    out[(e.key, e.model, "c")] += e.completion_tokens
        pairs = {(k, m) for k, m, _ in out}
        return {(k, m): (out[(k, m, "r")], out[(k, m, "p")], out[(k, m, "c")])
                for k, m in pairs}


@contextlib.contextmanager
def router_at(control_url: str, workers: int = 2, **settings: Any) -> Iterator[str]:
    """The real router (serve.run in a subprocess, API keys required), stopped after."""
    proc, url = start_router(control_url, ROUTER_TOKEN, workers=workers,
                             refresh_interval_s=0.2, activation_timeout_s=2.0, **settings)
    try:
        yield url
    finally:
        stop(proc)
