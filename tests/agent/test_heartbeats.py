"""The agent's heartbeats (issue 30) against a real control service on loopback: the full
report first, then heartbeats with only what changed; the full report again when anything
else changed, when asked, and every FULL_REPORT_EVERY_S; full reports only to a control
service without the endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.agent import Agent, loop
from llmgw_runtime.api.transport import RemoteError
from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.store import Store
from tests.control.conftest import ADMIN, JOIN, ROUTER, served

from .test_agent_config_and_loop import config

REPORT, HEARTBEAT = "/api/v1/agent/report", "/api/v1/agent/heartbeat"


class Control:
    """The control service's app and what the agent posted to it (path, body)."""

    def __init__(self, app: Any, url: str) -> None:
        self.app, self.url = app, url
        self.posts: list[tuple[str, Any]] = []

    def paths(self) -> list[str]:
        got = [p for p, _ in self.posts]
        self.posts.clear()
        return got


@pytest.fixture
def control(tmp_path: Path) -> Iterator[Control]:
    settings = ControlConfig(state_dir=tmp_path / "control", admin_token=ADMIN,
                             join_token=JOIN, router_token=ROUTER)
    store = Store(f"sqlite:///{tmp_path}/llmgw.db")
    store.migrate()
    bootstrap(store, settings)
    app = create_app(settings, store_=store)
    try:
        with served(app) as url:
            yield Control(app, url)
    finally:
        store.dispose()


def agent_of(control: Control, tmp_path: Path, *, older: bool = False,
             refuse: list[int] | None = None) -> Agent:
    """An agent whose posts are noted; ``older``: the control service answers a heartbeat
    404, as one from before heartbeats does; ``refuse``: the statuses its next heartbeats
    are refused with."""
    agent = Agent.from_config(config(tmp_path, control_url=control.url,
                                     join_token=JOIN))
    transport = agent.client.transport
    request = transport.request

    def noted(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        if path != "/api/v1/agent/join":
            control.posts.append((path, body))
        if older and path == HEARTBEAT:
            raise RemoteError(404, "not_found", "The requested URL was not found")
        if refuse and path == HEARTBEAT:
            raise RemoteError(refuse.pop(0), "refused", "no")
        return request(method, path, body, **kw)

    transport.request = noted  # type: ignore[method-assign]
    return agent


def test_a_full_report_first_then_heartbeats_with_what_changed(
        control: Control, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = agent_of(control, tmp_path)
    running = [{"id": "r1", "model": "tiny", "state": "starting", "port": None, "pid": 7}]
    monkeypatch.setattr(agent.supervisor, "states", lambda: [dict(r) for r in running])
    agent.run_cycle()
    agent.run_cycle()
    assert control.paths() == [REPORT, HEARTBEAT]

    running[0]["state"] = "ready"
    agent.run_cycle()
    running[0]["state"] = "starting"                     # as in the full report again
    agent.run_cycle()
    posted = [body for path, body in control.posts if path == HEARTBEAT]
    assert control.paths() == [HEARTBEAT, HEARTBEAT]
    assert [r.state for r in posted[0].replicas] == ["ready"]
    assert [r.state for r in posted[1].replicas] == ["starting"]   # carried till the next

    agent.engines = [*agent.engines, "vllm"]             # anything else: in full
    agent.run_cycle()
    assert control.paths() == [REPORT]
    control.app.extensions["llmgw.reports"].reports.clear()   # a control restart
    agent.run_cycle()
    assert control.paths() == [HEARTBEAT, REPORT]              # asked, sent at once
    monkeypatch.setattr(loop, "FULL_REPORT_EVERY_S", 0.0)
    agent.run_cycle()
    assert control.paths() == [REPORT]


def test_an_older_control_service_gets_full_reports(control: Control, tmp_path: Path) -> None:
    agent = agent_of(control, tmp_path, older=True)
    for _ in range(4):
        agent.run_cycle()
    assert control.paths() == [REPORT, HEARTBEAT, REPORT, REPORT, REPORT]
    assert not agent.heartbeats


def test_a_refused_heartbeat_is_followed_by_the_full_report_at_once(
        control: Control, tmp_path: Path) -> None:
    agent = agent_of(control, tmp_path, refuse=[400, 401])
    for _ in range(4):
        agent.run_cycle()
    assert control.paths() == [REPORT, HEARTBEAT, REPORT, HEARTBEAT, REPORT, HEARTBEAT]
    assert agent.heartbeats
