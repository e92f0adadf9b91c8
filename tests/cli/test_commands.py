"""The service commands refuse bad settings with every problem at once, before starting;
``ctl`` revokes keys and nodes and never prints a control character it was sent."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw_runtime.cli.main import cli
from llmgw_runtime.cli.text import clean, printable, printable_lines
from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.security import hash_token
from llmgw_runtime.store import Store, repo
from tests.control.conftest import ADMIN, CPU, JOIN, ROUTER, served


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env=env or {})
    return result.exit_code, result.output


def test_server_migrate_creates_the_store(tmp_path: Path) -> None:
    code, out = invoke("server", "--database-url", f"sqlite:///{tmp_path}/s.db", "migrate")
    assert code == 0 and "store migrated to revision 0007" in out
    assert (tmp_path / "s.db").is_file()


def test_agent_without_control_url_or_join_token_names_both() -> None:
    code, out = invoke("agent", env={"LLMGW_CONTROL_URL": "", "LLMGW_JOIN_TOKEN": ""})
    assert code == 1
    assert "LLMGW_CONTROL_URL" in out and "LLMGW_JOIN_TOKEN" in out


def test_router_without_its_token_refuses_to_start() -> None:
    code, out = invoke("router", "--control-url", "http://127.0.0.1:1",
                       env={"LLMGW_ROUTER_TOKEN": ""})
    assert code == 1 and "router_token" in out.lower()


def test_bad_environment_values_are_reported_together() -> None:
    code, out = invoke("server", "migrate", env={"LLMGW_PORT": "x", "LLMGW_WORKERS": "many"})
    assert code == 1
    assert "LLMGW_PORT='x' is not an integer" in out
    assert "LLMGW_WORKERS='many' is not an integer" in out


def test_up_refuses_a_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out = invoke("up", "--state-dir", str(tmp_path), "--control-port", str(port))
    assert code == 1 and f"port {port} for the control service is in use" in out


# ---------------------------------------------------------------- the sanitiser


@pytest.mark.parametrize(("raw", "shown"), [
    ("gpu-01", "gpu-01"),
    ("n\x1b[2J", "n\\x1b[2J"),
    ("a\nb\tc\rd\x00", "a\\x0ab\\x09c\\x0dd\\x00"),
    ("del\x7f c1\x9b31m \x85", "del\\x7f c1\\x9b31m \\x85"),
    ("\u202egnp.exe", "\\u202egnp.exe"),
    ("ünïcødé ✓ 模型", "ünïcødé ✓ 模型"),
])
def test_printable_shows_every_control_character_as_an_escape(raw: str, shown: str) -> None:
    assert printable(raw) == shown


def test_clean_reaches_every_string_and_lines_keep_their_newlines() -> None:
    doc = {"n\x1b": ["\x1b", 1, None, {"k": ("\x07",)}]}
    assert clean(doc) == {"n\\x1b": ["\\x1b", 1, None, {"k": ("\\x07",)}]}
    assert printable_lines("one\x1b\ntwo") == "one\\x1b\ntwo"


# ---------------------------------------------------------------- ctl against a service


@pytest.fixture
def control(store: Store, tmp_path: Path) -> Iterator[str]:
    config = ControlConfig(state_dir=tmp_path, admin_token=ADMIN, join_token=JOIN,
                           router_token=ROUTER)
    bootstrap(store, config)
    app = create_app(config, store_=store)
    app.extensions["test.store"] = store
    with served(app) as url:
        yield url


def ctl(url: str, *args: str) -> tuple[int, str]:
    return invoke("ctl", "--url", url, "--token", ADMIN, *args)


def put_node(store: Store, name: str, age: float = 1.0) -> None:
    with store.begin() as conn:
        repo.set_node_credential(conn, name, hash_token("cred-" + name), time.time())
        repo.record_report(conn, name, {"devices": [CPU], "address": "127.0.0.1"},
                           time.time() - age)


def test_ctl_keys_delete_revokes_a_key_and_names_a_missing_one(control: str) -> None:
    assert ctl(control, "keys", "create", "ci")[0] == 0
    code, out = ctl(control, "keys", "delete", "ci")
    assert code == 0 and "API key ci deleted" in out and "next routes refresh" in out
    assert "ci" not in ctl(control, "keys", "list")[1]
    code, out = ctl(control, "keys", "delete", "ci")
    assert code == 1 and "there is no API key named 'ci'" in out


def test_ctl_nodes_reset_and_delete(control: str, store: Store) -> None:
    put_node(store, "gone", age=3600)
    put_node(store, "live")
    put_node(store, "a/b", age=3600)                 # a name that is not one URL segment
    code, out = ctl(control, "nodes", "reset", "live")
    assert code == 0 and "node live: credential reset" in out
    with store.begin() as conn:
        assert repo.get_node(conn, "live").credential_hash is None
    code, out = ctl(control, "nodes", "delete", "live")
    assert code == 1 and "reported" in out and "--force" in out
    assert ctl(control, "nodes", "delete", "--force", "live") == (0, "node live deleted\n")
    assert ctl(control, "nodes", "delete", "gone") == (0, "node gone deleted\n")
    assert ctl(control, "nodes", "delete", "a/b")[0] == 0
    code, out = ctl(control, "nodes", "delete", "nope")
    assert code == 1 and "there is no node named 'nope'" in out
    listed = json.loads(ctl(control, "nodes", "-o", "json")[1])["nodes"]
    assert [n["name"] for n in listed] == []
    code, out = ctl(control, "nodes")
    assert code == 0 and out.splitlines()[0].startswith("NODE")


def test_ctl_never_prints_an_escape_sequence_it_was_sent(control: str, store: Store) -> None:
    evil = "\x1b[2J"
    put_node(store, f"n{evil}")
    with store.begin() as conn:
        repo.put_account(conn, f"key:k{evil}", "api_key", hash_token("k"), time.time())
        repo.add_event(conn, time.time(), "node", f"n{evil}", f"said\n{evil}hello")
    outputs = {args: ctl(control, *args) for args in (
        ("nodes",), ("keys", "list"), ("events",), ("status",), ("status", "--color"),
        ("nodes", "delete", f"n{evil}"), ("nodes", "reset", f"n{evil}"),
        ("keys", "delete", f"nope{evil}"))}
    for args, (_code, out) in outputs.items():
        assert "\x1b[2J" not in out, args
    assert "n\\x1b[2J" in outputs[("nodes",)][1]
    assert "k\\x1b[2J" in outputs[("keys", "list")][1]
    assert "said\\x0a\\x1b[2Jhello" in outputs[("events",)][1]
    assert outputs[("nodes", "reset", f"n{evil}")] == (
        0, "node n\\x1b[2J: credential reset; its agent joins again with the join token\n")
    code, out = outputs[("keys", "delete", f"nope{evil}")]
    assert code == 1 and "nope\\x1b[2J" in out
    code, out = outputs[("nodes", "delete", f"n{evil}")]   # 409: the server's message
    assert code == 1 and "Stop the agent on n\\x1b[2J first" in out
    code, out = ctl(control, "nodes", "-o", "json")   # JSON escapes it itself
    assert code == 0 and "n\\u001b[2J" in out and "\x1b" not in out
