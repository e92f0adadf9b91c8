"""Fixtures for router tests: fake engines (real processes), a stand-in control service (a
thread), and the real router served by ``serve.run`` in a subprocess."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import openai
import pytest
from werkzeug.wrappers import Request, Response

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import harness  # noqa: E402
from fake_control import FakeControl  # noqa: E402

from llmgw_runtime.security import hash_token  # noqa: E402

ROUTER_TOKEN = "llmgw-router-test-token-0123456789"    # passes the strength check
API_KEY = "sk-llmgw-test-key"


def model(name: str, state: str = "ready", endpoints: Sequence[tuple[str, str]] = (),
          reason: str | None = None, on_demand: bool = False,
          **streak: Any) -> dict[str, Any]:
    """A routes-table entry; ``streak``: failures, last_error, retry_after_s."""
    return {"name": name, "state": state, "reason": reason, "on_demand": on_demand,
            "endpoints": [{"replica_id": rid, "url": url} for rid, url in endpoints],
            **streak}


class Control(FakeControl):
    """The stand-in control service, also taking ``POST /api/v1/unreachable`` (recorded,
    then ``on_unreachable`` may change the table as the control service would), and
    keeping every idle map whole (``idle_maps``: worker, in_flight, versions)."""

    def __init__(self, routes: dict[str, Any], token: str) -> None:
        self.unreachable_posts: list[dict[str, Any]] = []
        self.idle_maps: list[dict[str, Any]] = []
        self.on_unreachable: Callable[[dict[str, Any]], None] | None = None
        super().__init__(routes, token)

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        req = Request(environ)
        if (req.method == "POST" and req.path == "/api/v1/idle"
                and req.headers.get("Authorization") == f"Bearer {self.token}"):
            posted = json.loads(req.get_data())
            self.idle_maps.append(posted)
            self.idle_posts.append(posted["replicas"])
            if posted.get("capacity"):
                self.capacity_posts.append(posted["capacity"])
            return Response(b"", 204)(environ, start_response)
        if (req.method == "POST" and req.path == "/api/v1/unreachable"
                and req.headers.get("Authorization") == f"Bearer {self.token}"):
            body = json.loads(req.get_data())
            self.unreachable_posts.append(body)
            if self.on_unreachable is not None:
                self.on_unreachable(body)
            return Response(b"", 204)(environ, start_response)
        return super()._wsgi(environ, start_response)


def table(*models: dict[str, Any], keys: Sequence[str] = (API_KEY,),
          scopes: dict[str, list[str]] | None = None,
          expires_in_s: dict[str, float] | None = None) -> dict[str, Any]:
    """A routes table; ``scopes`` and ``expires_in_s`` by key (not hashed)."""
    return {"models": list(models), "api_key_hashes": [hash_token(k) for k in keys],
            "key_models": {hash_token(k): v for k, v in (scopes or {}).items()},
            "key_expires_in_s": {hash_token(k): v for k, v in (expires_in_s or {}).items()}}


@pytest.fixture(scope="session")
def engines() -> Iterator[dict[str, str]]:
    procs = []
    urls = {}
    try:
        for name in ("e1", "e2"):
            proc, url = harness.start_engine(name)
            procs.append(proc)
            urls[name] = url
        yield urls
    finally:
        for proc in procs:
            harness.stop(proc)


@pytest.fixture(scope="session")
def dead_url() -> str:
    return f"http://127.0.0.1:{harness.free_port()}"  # nothing listens there


def _base_models(engines: dict[str, str], dead_url: str) -> list[dict[str, Any]]:
    return [
        model("chat", endpoints=[("r-e1", engines["e1"]), ("r-e2", engines["e2"])]),
        model("deadmix", endpoints=[("r-dead", dead_url), ("r-live", engines["e2"])]),
        model("alldead", endpoints=[("r-dead", dead_url)]),
        model("parked", "parked", reason="engine exited: CUDA out of memory"),
        model("unplaceable", "unplaceable", reason="no a100-80g device with 80 GB free"),
        model("ondemand", "idle", on_demand=True),
        model("never", "idle", on_demand=True),
        model("refused", "idle", on_demand=True),
    ]


@pytest.fixture(scope="session")
def control(engines: dict[str, str], dead_url: str) -> Iterator[Control]:
    ctl = Control(table(*_base_models(engines, dead_url)), ROUTER_TOKEN)

    def make_ready() -> None:
        models = [m for m in ctl.routes["models"] if m["name"] != "ondemand"]
        models.append(model("ondemand", endpoints=[("r-od", engines["e1"])], on_demand=True))
        ctl.set_routes(dict(ctl.routes, models=models))

    def activate_ondemand() -> dict[str, Any]:
        threading.Timer(0.5, make_ready).start()
        return {"model": "ondemand", "state": "starting", "reason": None}

    ctl.on_activate["ondemand"] = activate_ondemand
    ctl.on_activate["refused"] = lambda: {"model": "refused", "state": "unplaceable",
                                          "reason": "no device fits 4 gpus"}
    ctl.start()
    yield ctl
    ctl.stop()


@contextlib.contextmanager
def running_router(control_url: str, workers: int) -> Iterator[str]:
    """The real router (serve.run in a subprocess) with ``workers`` gevent workers, API keys
    required, a fast routes refresh; stopped on leaving."""
    proc, url = harness.start_router(control_url, ROUTER_TOKEN, workers=workers,
                                     refresh_interval_s=0.2, activation_timeout_s=2.0)
    try:
        yield url
    finally:
        harness.stop(proc)


@pytest.fixture(scope="session")
def router(control: FakeControl) -> Iterator[str]:
    """The real router with 2 gevent workers."""
    with running_router(control.url, workers=2) as url:
        yield url


@pytest.fixture(scope="session")
def router_one(control: FakeControl) -> Iterator[str]:
    """One gevent worker, so one balancer sees every request (balancing tests)."""
    with running_router(control.url, workers=1) as url:
        yield url


@pytest.fixture
def client(router: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=router + "/v1", api_key=API_KEY, max_retries=0, timeout=20)
