"""A stand-in for the control service's router API, for tests and the benchmark.

It serves ``GET /api/v1/routes`` (the table a test sets), records ``POST /api/v1/idle`` (and
the capacity reports in it) and
``POST /api/v1/activate`` calls and checks the router token. Runs in a thread of the caller.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

logging.getLogger("werkzeug").setLevel(logging.WARNING)


class FakeControl:
    def __init__(self, routes: dict[str, Any], token: str) -> None:
        self.routes = routes
        self.token = token
        self.idle_posts: list[dict[str, float]] = []
        self.capacity_posts: list[dict[str, Any]] = []   # IdleMap.capacity, when not empty
        self.activations: list[str] = []
        self.route_gets = 0
        # model -> callable run on activate, returning the answer (default: "starting")
        self.on_activate: dict[str, Callable[[], dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True)
        self.port = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FakeControl:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def set_routes(self, routes: dict[str, Any]) -> None:
        with self._lock:
            self.routes = routes

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        req = Request(environ)
        if req.headers.get("Authorization") != f"Bearer {self.token}":
            resp = Response(json.dumps({"error": {"code": 401, "reason": "unauthorized",
                                                  "message": "bad router token"}}), 401,
                            content_type="application/json")
            return resp(environ, start_response)
        if req.method == "GET" and req.path == "/api/v1/routes":
            with self._lock:
                self.route_gets += 1
                body = json.dumps(self.routes)
            resp = Response(body, 200, content_type="application/json")
        elif req.method == "POST" and req.path == "/api/v1/idle":
            with self._lock:
                posted = json.loads(req.get_data())
                self.idle_posts.append(posted["replicas"])
                if posted.get("capacity"):
                    self.capacity_posts.append(posted["capacity"])
            resp = Response(b"", 204)
        elif req.method == "POST" and req.path == "/api/v1/activate":
            model = json.loads(req.get_data())["model"]
            with self._lock:
                self.activations.append(model)
            hook = self.on_activate.get(model)
            answer = hook() if hook else {"model": model, "state": "starting", "reason": None}
            resp = Response(json.dumps(answer), 200, content_type="application/json")
        else:
            resp = Response(b'{"error": {"reason": "not_found"}}', 404,
                            content_type="application/json")
        return resp(environ, start_response)
