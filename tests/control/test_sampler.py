"""The minute's history sample in a process of its own (control/sampler.py): it samples
only while the reconciler that started it leads, once a minute; in the server it runs at
nice 19 as the reconciler process's child, and ends with that reconciler (a clean stop,
or its parent killed)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa

from llmgw_runtime.control import history, sampler
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.control.reconcile import LEASE, config_env, start_process
from llmgw_runtime.store import Store
from llmgw_runtime.store.leases import try_lease
from llmgw_runtime.store.schema import history_classes
from tests.support.procs import children, nice

from .conftest import Api


def _lease(store: Store, holder: str) -> None:
    with store.begin() as conn:
        assert try_lease(conn, LEASE, holder, store.now(conn), 60.0)


def test_it_samples_once_a_minute_and_only_while_its_reconciler_leads(store: Store) -> None:
    """Another host's reconciler holds the lease: nothing; this host's: the minute, once."""
    recorder = history.Recorder(14, 30)
    _lease(store, "another-host")
    assert not sampler.sample_if_leading(store, recorder, "this-host", LEASE)
    with store.begin() as conn:                 # the lease moves to this host
        conn.execute(sa.text("DELETE FROM leases"))
    _lease(store, "this-host")
    assert sampler.sample_if_leading(store, recorder, "this-host", LEASE)
    assert not sampler.sample_if_leading(store, recorder, "this-host", LEASE)  # same minute


def test_it_looks_again_just_past_each_minute_and_at_least_every_few_seconds() -> None:
    """At most 5 s apart (a new leader samples soon), else half a second past the next
    minute's start."""
    assert sampler.until_next_minute(120.0) == 5.0
    assert sampler.until_next_minute(178.0) == 2.5
    assert abs(sampler.until_next_minute(179.9) - 0.6) < 1e-9


def _wait(what: str, check, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


def test_the_server_reconciler_samples_in_its_own_process_at_the_lowest_priority(
        api: Api, store_url: str) -> None:
    """The reconciler process (web workers below it: LLMGW_WEB_NICE 5) starts the sampler
    as its child at nice 19; the sampler writes the minute's points of the fleet it reads
    (a node with one CPU device) while its reconciler leads, and stops with it: after a
    SIGTERM, and when the reconciler is killed outright (no orphan left sampling)."""
    api.report(api.join("n1"), "n1")
    config = dataclasses.replace(api.config, database_url=store_url,
                                 reconcile_interval_s=0.2)
    for how in (signal.SIGTERM, signal.SIGKILL):
        proc = start_process(config)
        try:
            [(kid, argv)] = _wait("the sampler started", lambda pid=proc.pid: [
                k for k in children(pid) if "llmgw_runtime.control.sampler" in k[1]])
            _wait("the sampler at nice 19", lambda pid=kid: nice(pid) == 19)  # set at start
            assert nice(proc.pid) < 19, argv
            _wait("the minute's class point written", lambda: _classes(api.store))
            os.kill(proc.pid, how)
            proc.wait(15)
            _wait("the sampler gone with its reconciler", lambda pid=kid: not _alive(pid), 15.0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with api.store.begin() as conn:
            conn.execute(history_classes.delete())
            conn.execute(sa.text("DELETE FROM leases"))


def _classes(store: Store) -> list[object]:
    with store.begin() as conn:
        return list(conn.execute(sa.select(history_classes)).all())


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_sampler_that_stopped_is_started_again_but_not_in_a_loop(tmp_path: Path) -> None:
    """The reconciler asks after each pass it leads; a sampler that died is started again
    once ``RESTART_AFTER_S`` passed since the last start, not at every pass."""
    config = ControlConfig(state_dir=tmp_path)
    handle = sampler.Handle("this-host", {**os.environ, **config_env(config)})
    handle.ensure()
    first = handle.proc
    assert first is not None
    first.kill()
    first.wait()
    handle.ensure()                             # within RESTART_AFTER_S: not yet
    assert handle.proc is first
    handle._started_at = time.monotonic() - sampler.RESTART_AFTER_S - 1
    handle.ensure()
    assert handle.proc is not first and handle.proc is not None
    assert handle.proc.poll() is None
    handle.stop()
    assert handle.proc is None
    assert first.returncode is not None


def test_a_sampler_whose_reconciler_is_already_gone_ends_at_once(tmp_path: Path) -> None:
    """Started for a reconciler that died before the sampler looked (its parent is then
    another process), it ends instead of looking at the lease for ever."""
    config = ControlConfig(state_dir=tmp_path)
    env = {**os.environ, **config_env(config), sampler.HOLDER_ENV: "gone-host",
           sampler.PARENT_ENV: "1"}
    done = subprocess.run([sys.executable, "-m", "llmgw_runtime.control.sampler"], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_sampler_named_a_parent_that_is_no_process_id_refuses_to_start(
        tmp_path: Path) -> None:
    """Its environment is the reconciler's; a parent that is not a process id (text, a
    sign, a number too long to be one) stops it at once, saying which variable."""
    config = ControlConfig(state_dir=tmp_path)
    for bad in ("reconciler", "-5", "1" * 40, "\x1b[2J", "1e3"):
        env = {**os.environ, **config_env(config), sampler.HOLDER_ENV: "this-host",
               sampler.PARENT_ENV: bad}
        done = subprocess.run([sys.executable, "-m", "llmgw_runtime.control.sampler"],
                              env=env, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=30)
        assert done.returncode == 2 and b"LLMGW_HISTORY_PARENT" in done.stderr, bad
