"""State directories are 0700 and the store, the logs, the tokens and the kept catalog
0600: made so under the usual umask 022, and tightened when an older llmgw left them
0755/0644. Through the code that makes them: ``llmgw up``'s start-up, the SQLite store,
``llmgw server migrate``, the agent's state directory."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw_runtime.agent.config import AgentConfig
from llmgw_runtime.cli.main import cli
from llmgw_runtime.cli.up import Child, demo_model_path, prepare_state, stored_catalog
from llmgw_runtime.security import private_dir
from llmgw_runtime.store.db import Store


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> str:
    return oct(path.stat().st_mode & 0o777)


def modes(root: Path) -> dict[str, str]:
    """Every path under ``root`` (and root itself, as "."), with its mode."""
    out = {".": mode(root)}
    for path in sorted(root.rglob("*")):
        out[str(path.relative_to(root))] = mode(path)
    return out


def _start_up(state: Path, catalog: Path | None = None) -> dict[str, str]:
    """What ``llmgw up`` makes before it serves: the state dir, tokens, the catalog, a
    child's log, and the control service's SQLite store (its -wal/-shm while open)."""
    logs, tokens = prepare_state(state)
    assert set(tokens) == {"admin", "join", "router"}
    stored_catalog(state, catalog)
    child = Child("control service", ["true"], dict(os.environ), logs / "control.log")
    child.proc.wait()
    child.stop()
    store = Store(f"sqlite:///{state / 'llmgw.db'}")
    try:
        store.migrate()
        return modes(state)
    finally:
        store.dispose()


def test_up_makes_its_state_private_under_umask_022(tmp_path: Path) -> None:
    if not demo_model_path().is_file():
        pytest.skip("the demo model is not installed")
    state = tmp_path / "state"
    assert _start_up(state) == {
        ".": "0o700", "catalog.yaml": "0o600", "llmgw.db": "0o600", "llmgw.db-shm": "0o600",
        "llmgw.db-wal": "0o600", "logs": "0o700", "logs/control.log": "0o600",
        "secrets": "0o700", "secrets/admin-token": "0o600", "secrets/join-token": "0o600",
        "secrets/router-token": "0o600"}


def test_up_tightens_what_an_older_llmgw_left_open(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    (state / "secrets").mkdir()
    for path, text in ((state / "catalog.yaml", "models: []\n"),
                       (state / "logs" / "control.log", "old lines\n"),
                       (state / "secrets" / "admin-token", "llmgw-admin-old\n")):
        path.write_text(text)
        path.chmod(0o644)
    with sqlite3.connect(state / "llmgw.db") as conn:   # 0644, as SQLite makes it
        conn.execute("CREATE TABLE t (x)")
    for path in (state, state / "logs", state / "secrets"):
        path.chmod(0o755)
    assert mode(state / "llmgw.db") == "0o644"

    got = _start_up(state)
    assert {p: m for p, m in got.items() if m not in ("0o600", "0o700")} == {}
    assert got["."] == got["logs"] == got["secrets"] == "0o700"
    assert got["llmgw.db"] == got["llmgw.db-wal"] == got["catalog.yaml"] == "0o600"
    assert (state / "logs" / "control.log").read_text() == "old lines\n"   # appended to
    assert (state / "secrets" / "admin-token").read_text() == "llmgw-admin-old\n"


def test_a_new_sqlite_store_and_its_directory_are_private(tmp_path: Path) -> None:
    db = tmp_path / "new" / "dir" / "llmgw.db"
    store = Store(f"sqlite:///{db}")
    try:
        store.migrate()
        assert modes(db.parent) == {".": "0o700", "llmgw.db": "0o600",
                                    "llmgw.db-shm": "0o600", "llmgw.db-wal": "0o600"}
    finally:
        store.dispose()


def test_server_migrate_makes_the_control_state_dir_private(tmp_path: Path) -> None:
    state = tmp_path / "control"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    result = CliRunner().invoke(cli, ["server", "--state-dir", str(state), "migrate"])
    assert result.exit_code == 0, result.output
    got = modes(state)
    assert got.pop(".") == "0o700" and "llmgw.db" in got
    assert set(got) <= {"llmgw.db", "llmgw.db-wal", "llmgw.db-shm"}
    assert set(got.values()) == {"0o600"}


def test_the_agent_state_dir_is_private(tmp_path: Path) -> None:
    fresh = AgentConfig(state_dir=tmp_path / "agent").prepare_state_dir()
    old = tmp_path / "old-agent"
    old.mkdir(mode=0o755)
    old.chmod(0o755)
    AgentConfig(state_dir=old).prepare_state_dir()
    assert mode(fresh) == "0o700" and mode(old) == "0o700"


@pytest.mark.parametrize("before, after", [
    (None, "0o700"), (0o755, "0o700"), (0o775, "0o700"), (0o770, "0o700"),
    (0o750, "0o750"),            # group-read, as the Ansible roles make /var/lib/llmgw: kept
    (0o700, "0o700"),
])
def test_a_state_dir_open_to_others_or_group_writable_becomes_0700(
        tmp_path: Path, before: int | None, after: str) -> None:
    path = tmp_path / "state"
    if before is not None:
        path.mkdir()
        path.chmod(before)
    assert mode(private_dir(path)) == after
