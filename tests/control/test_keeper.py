"""The reconciler keeper (control/serve.py): a reconciler that dies is started again with an
error line, one that was told to stop as its server stops is not (no ERROR at shutdown)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from typing import Any

import pytest

from llmgw_runtime.control import serve
from llmgw_runtime.control.config import ControlConfig


def keeper_with(monkeypatch: pytest.MonkeyPatch, status: int) -> tuple[Any, list[Any]]:
    spawned: list[Any] = []

    def start(config: ControlConfig) -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({status})"])
        spawned.append(process)
        return process

    monkeypatch.setattr(serve, "start_process", start)
    monkeypatch.setattr(serve, "STOPPING_GRACE_S", 1.5)
    keeper = serve.ReconcilerKeeper(ControlConfig(database_url="sqlite:///:memory:"))
    keeper.start()
    return keeper, spawned


def wait_for(check: Any, within_s: float = 5.0) -> None:
    end = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < end
        time.sleep(0.05)


def test_a_reconciler_stopped_with_its_server_is_no_error(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=serve.__name__)
    keeper, spawned = keeper_with(monkeypatch, 0)
    wait_for(lambda: spawned and spawned[0].poll() is not None)
    time.sleep(0.3)
    keeper.stop()                       # the server's stop, just after the group's signal
    time.sleep(1.6)
    assert len(spawned) == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_reconciler_that_dies_is_started_again_with_an_error_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=serve.__name__)
    keeper, spawned = keeper_with(monkeypatch, 1)
    try:
        wait_for(lambda: len(spawned) >= 2)
    finally:
        keeper.stop()
    assert any("exited (status 1)" in r.getMessage() for r in caplog.records
               if r.levelno == logging.ERROR)
