"""The service commands refuse bad settings with every problem at once, before starting;
``ctl`` revokes keys and nodes and never prints a control character it was sent."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw_runtime.api.agent import Report
from llmgw_runtime.cli.main import cli
from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.security import hash_token
from llmgw_runtime.status.telling import telling_line
from llmgw_runtime.store import Store, accounts, repo
from tests.control.conftest import ADMIN, CPU, JOIN, ROUTER, served
from tests.store.test_admission_store import head


def invoke(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env=env or {})
    return result.exit_code, result.output


def test_server_migrate_creates_the_store(tmp_path: Path) -> None:
    code, out = invoke("server", "--database-url", f"sqlite:///{tmp_path}/s.db", "migrate")
    assert code == 0 and f"store migrated to revision {head()}" in out
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
        # stored under ``name``, which may be one no agent could report as (a/b, escapes)
        report = Report.model_validate({"node": "n", "devices": [CPU], "address": "127.0.0.1"})
        repo.record_report(conn, name, report, time.time() - age)


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
        accounts.put_account(conn, f"key:k{evil}", "api_key", hash_token("k"), time.time())
        repo.add_event(conn, time.time(), "node", f"n{evil}", f"said\n{evil}hello")
    outputs = {args: ctl(control, *args) for args in (
        ("nodes",), ("keys", "list"), ("events",), ("status",), ("status", "--color"),
        ("nodes", "delete", f"n{evil}"), ("nodes", "reset", f"n{evil}"),
        ("keys", "delete", f"nope{evil}"))}
    for args, (_code, out) in outputs.items():
        assert "\x1b[2J" not in out, args
    assert "n\\x1b[2J" in outputs[("nodes",)][1]
    assert "k\\x1b[2J" in outputs[("keys", "list")][1]
    # one line per event: its telling line, the escape shown, never sent
    assert "\\x1b[2Jhello" in outputs[("events",)][1]
    assert outputs[("nodes", "reset", f"n{evil}")] == (
        0, "node n\\x1b[2J: credential reset; its agent joins again with the join token\n")
    code, out = outputs[("keys", "delete", f"nope{evil}")]
    assert code == 1 and "nope\\x1b[2J" in out
    code, out = outputs[("nodes", "delete", f"n{evil}")]   # 409: the server's message
    assert code == 1 and "Stop the agent on n\\x1b[2J first" in out
    code, out = ctl(control, "nodes", "-o", "json")   # JSON escapes it itself
    assert code == 0 and "n\\u001b[2J" in out and "\x1b" not in out


# ---------------------------------------------------------------- listings, retry, apply

# What an engine that exits early leaves: the cause in the middle, noise after it.
ENGINE_LOG = ("start failed: exited with 1; last log lines:\n"
              "llama_model_loader: loaded meta data with 33 key-value pairs and 272 tensors "
              "from /models/a.gguf (version GGUF V3 (latest))\n"
              "error: unsupported argument: --flash-attn-typo\n"
              "usage: llama-server [options]\n"
              "  -h, --help, --usage                     print usage and exit")


def catalog_yaml(*names: str, replicas: int = 1) -> str:
    return "models:\n" + "".join(
        f"  - {{name: {n}, source: 'file:///models/{n}.gguf', engine: llama.cpp, "
        f"profile: {{class: cpu}}, replicas: {replicas}}}\n" for n in names)


def catalog_file(tmp_path: Path, text: str, name: str = "catalog.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def model_rows(store: Store) -> dict[str, tuple[int, str]]:
    with store.begin() as conn:
        return {m.name: (m.replicas, m.definition_hash) for m in repo.list_models(conn)}


def column(out: str, header: str) -> str:
    """The text of the table column ``header`` (the last one) in ``out``, its lines
    joined: a cell wrapped onto following lines reads as one text again."""
    lines = out.splitlines()
    start = lines[0].rindex(header.split()[0])
    return " ".join(line[start:].strip() for line in lines if line[start:].strip())


def test_listings_wrap_long_text_to_the_terminal_and_show_the_telling_line_whole(
        control: str, store: Store, tmp_path: Path) -> None:
    long = "a-model-with-a-rather-long-name"
    assert ctl(control, "apply", "-f", catalog_file(tmp_path, catalog_yaml(long, "b")))[0] == 0
    put_node(store, "gpu-node-01")
    with store.begin() as conn:
        now = time.time()
        repo.update_model(conn, long, parked=1, consecutive_failures=3, last_error=ENGINE_LOG)
        repo.add_replica(conn, "b-r0001", "b", "gpu-node-01", (0,), now)
        repo.update_replica(conn, "b-r0001", state="failed", last_error=ENGINE_LOG)
        repo.add_event(conn, now, "failure", "b", f"replica b-r0001 failed: {ENGINE_LOG}")
    telling = telling_line(ENGINE_LOG)
    assert "unsupported argument" in telling
    listings = {"models": "REASON", "replicas": "LAST ERROR", "events": "MESSAGE"}
    for command, header in listings.items():
        code, out = invoke("ctl", "--url", control, "--token", ADMIN, command,
                           env={"COLUMNS": "80"})
        assert code == 0, out
        assert max(len(line) for line in out.splitlines()) <= 80, out
        assert "usage: llama-server" not in out and "print usage" not in out
        assert "…" not in out, out                               # nothing is cut
        assert telling in column(out, header), (command, out)   # wrapped, whole
        if command == "models":
            assert long in out.split(), out                       # the name is not broken
        code, wide = invoke("ctl", "--url", control, "--token", ADMIN, command,
                            env={"COLUMNS": "200"})
        assert code == 0 and telling in wide and max(map(len, wide.splitlines())) <= 200
        assert len(wide.splitlines()) < len(out.splitlines()), wide  # room: fewer lines
    # the whole text is in -o json
    models = json.loads(ctl(control, "models", "-o", "json")[1])["models"]
    assert [m["last_error"] for m in models if m["name"] == long] == [ENGINE_LOG]
    replicas = json.loads(ctl(control, "replicas", "-o", "json")[1])["replicas"]
    assert replicas[0]["last_error"] == ENGINE_LOG


def test_retry_says_whether_the_model_was_parked(control: str, store: Store,
                                                 tmp_path: Path) -> None:
    assert ctl(control, "apply", "-f", catalog_file(tmp_path, catalog_yaml("a")))[0] == 0
    code, out = ctl(control, "retry", "a")
    assert (code, out) == (0, "model a was not parked: nothing to unpark (its failure count "
                              "was reset)\n")
    with store.begin() as conn:
        repo.update_model(conn, "a", parked=1, consecutive_failures=3, last_error="oom")
    assert ctl(control, "retry", "a") == (0, "model a unparked; it will be placed again\n")
    with store.begin() as conn:
        row = repo.get_model(conn, "a")
    assert (row.parked, row.consecutive_failures) == (0, 0)
    code, out = ctl(control, "retry", "nope")
    assert code == 1 and "'nope' is not in the catalog" in out


def test_apply_prune_lists_what_it_deletes_and_needs_yes_off_a_terminal(
        control: str, store: Store, tmp_path: Path) -> None:
    assert ctl(control, "apply", "-f", catalog_file(tmp_path, catalog_yaml("a", "b", "c")))[0] \
        == 0
    one = catalog_file(tmp_path, catalog_yaml("a"), "one.yaml")
    code, out = ctl(control, "apply", "-f", one, "--prune")
    assert code == 1
    assert "--prune deletes 2 models that the catalog does not name: b, c" in out
    assert "Pass --yes" in out and "nothing was applied" in out
    assert sorted(model_rows(store)) == ["a", "b", "c"]
    code, out = ctl(control, "apply", "-f", one, "--prune", "--yes")
    assert (code, out) == (0, "model b deleted\nmodel c deleted\nmodel a unchanged\n")
    assert sorted(model_rows(store)) == ["a"]
    # nothing to delete: nothing to confirm
    assert ctl(control, "apply", "-f", one, "--prune") == (0, "model a unchanged\n")


def test_apply_dry_run_shows_the_change_and_changes_nothing(control: str, store: Store,
                                                            tmp_path: Path) -> None:
    assert ctl(control, "apply", "-f", catalog_file(tmp_path, catalog_yaml("a", "b")))[0] == 0
    before = model_rows(store)
    events = json.loads(ctl(control, "events", "-o", "json")[1])["events"]
    changed = catalog_file(tmp_path, catalog_yaml("a", replicas=2) + catalog_yaml("c")
                           .removeprefix("models:\n"), "changed.yaml")
    code, out = ctl(control, "apply", "-f", changed, "--prune", "--dry-run")
    assert (code, out.splitlines()) == (0, ["model c would be created",
                                            "model a would be updated",
                                            "  replicas: 1 -> 2",
                                            "model b would be deleted",
                                            "dry run: nothing was changed"])
    code, out = ctl(control, "apply", "-f", changed, "--dry-run")
    assert code == 0 and "1 model not in the catalog kept: b (--prune deletes them)" in out
    assert model_rows(store) == before
    assert json.loads(ctl(control, "events", "-o", "json")[1])["events"] == events
    code, out = ctl(control, "apply", "-f", changed)             # the real thing agrees
    assert (code, out.splitlines()) == (0, ["model c created", "model a updated: replicas",
                                            "1 model not in the catalog kept: b (--prune "
                                            "deletes them)"])


def test_applying_a_catalog_without_models_says_nothing_was_applied(
        control: str, store: Store, tmp_path: Path) -> None:
    empty = catalog_file(tmp_path, "models: []\n", "empty.yaml")
    assert ctl(control, "apply", "-f", empty) == (
        0, "the catalog has no models: nothing applied (the store has none either)\n")
    assert ctl(control, "apply", "-f", catalog_file(tmp_path, catalog_yaml("a", "b")))[0] == 0
    assert ctl(control, "apply", "-f", empty) == (
        0, "the catalog has no models: nothing applied; the 2 models in the store were "
           "kept (a, b): --prune deletes them all\n")
    assert sorted(model_rows(store)) == ["a", "b"]


def on_terminal(argv: list[str], answer: str, prompt: str, timeout: float = 60) -> str:
    """Run ``argv`` on a pseudo-terminal, type ``answer`` once ``prompt`` shows; its output."""
    import os
    import pty
    import select
    import subprocess

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out, answered, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 4096)
                except OSError:           # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                out += chunk
            if not answered and prompt.encode() in out:
                os.write(master, answer.encode() + b"\n")
                answered = True
            if proc.poll() is not None and not select.select([master], [], [], 0.2)[0]:
                break
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return out.decode(errors="replace").replace("\r\n", "\n")


def test_apply_prune_asks_on_a_terminal_and_no_keeps_everything(
        control: str, store: Store, tmp_path: Path) -> None:
    import shutil
    import sys

    exe = shutil.which("llmgw", path=str(Path(sys.executable).parent))
    assert exe, "llmgw is not installed in the venv (pip install -e .)"
    assert ctl(control, "apply", "-f", catalog_file(tmp_path, catalog_yaml("a", "b")))[0] == 0
    one = catalog_file(tmp_path, catalog_yaml("a"), "one.yaml")
    argv = [exe, "ctl", "--url", control, "--token", ADMIN, "apply", "-f", one, "--prune"]
    out = on_terminal(argv, "", "delete 1 model? [y/N]")        # Enter: the default, no
    assert "--prune deletes 1 model that the catalog does not name: b" in out
    assert "not confirmed: nothing was applied" in out
    assert sorted(model_rows(store)) == ["a", "b"]
    out = on_terminal(argv, "y", "delete 1 model? [y/N]")
    assert "model b deleted" in out and sorted(model_rows(store)) == ["a"]


# ---------------------------------------------------------------- finding the control service


def test_ctl_pointed_at_a_router_names_the_control_service(control: str) -> None:
    from flask import Flask

    from llmgw_runtime.router.app import create_app as router_app
    from llmgw_runtime.router.config import RouterConfig

    app = router_app(RouterConfig(control_url=control, router_token=ROUTER))
    try:
        with served(app) as router_url:
            code, out = ctl(router_url, "status")
    finally:
        app.extensions["llmgw_router"].routes.stop()
    assert code == 1 and "this is the llmgw router" in out
    assert f"llmgw ctl --url {control} ..." in out
    with served(Flask("not-llmgw")) as other:          # something else: an HTML 404
        code, out = ctl(other, "models")
    assert code == 1 and f"{other} does not serve the admin API" in out
    assert "port 8470 by default" in out and "--url" in out


def test_ctl_finds_the_url_a_running_up_wrote_in_the_state_directory(
        control: str, tmp_path: Path) -> None:
    from llmgw_runtime.cli.up import forget_control_url, write_control_url

    state = tmp_path / "state"
    (state / "secrets").mkdir(parents=True)
    (state / "secrets" / "admin-token").write_text(ADMIN + "\n")
    env: dict[str, str | None] = {"LLMGW_STATE_DIR": str(state), "LLMGW_CONTROL_URL": None,
                                  "LLMGW_ADMIN_TOKEN": None}
    path = write_control_url(state, control)
    assert path.stat().st_mode & 0o077 == 0
    code, out = invoke("ctl", "models", env=env)
    assert code == 0 and out.startswith("MODEL"), out
    forget_control_url(state, control)                 # `up` stopped: back to the default
    assert not path.exists()
    write_control_url(state, "http://127.0.0.1:9")      # a stale one names its file
    code, out = invoke("ctl", "models", env=env)
    assert code == 1 and f"http://127.0.0.1:9 (read from {path}, written by `llmgw up`)" in out
    assert invoke("ctl", "models", env={**env, "LLMGW_CONTROL_URL": control})[0] == 0


def test_up_banner_gives_the_exact_ctl_command(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from llmgw_runtime.cli.up import ctl_command

    state = tmp_path / "state"
    monkeypatch.setenv("LLMGW_STATE_DIR", str(state))
    assert ctl_command("http://127.0.0.1:8470", state) == "llmgw ctl status"
    assert ctl_command("http://127.0.0.1:9470", state) == \
        "llmgw ctl --url http://127.0.0.1:9470 status"
    monkeypatch.delenv("LLMGW_STATE_DIR")
    monkeypatch.chdir(tmp_path)                         # ctl would look in ./.llmgw
    assert ctl_command("http://127.0.0.1:9470", state) == \
        f"LLMGW_STATE_DIR={state} llmgw ctl --url http://127.0.0.1:9470 status"


def test_help_shows_each_program_as_it_is_run() -> None:
    import shutil
    import subprocess
    import sys

    exe = shutil.which("llmgw-status", path=str(Path(sys.executable).parent))
    assert exe, "llmgw-status is not installed in the venv (pip install -e .)"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "Usage: llmgw-status [OPTIONS]\n" in out
    assert "--url" in out and "--watch" in out and "status status" not in out
    code, out = invoke("router", "--help")
    assert code == 0 and "[required]" not in out and "--no-require-api-key" in out


def test_a_prune_deletes_exactly_what_was_shown_or_nothing(
        control: str, store: Store, tmp_path: Path) -> None:
    # ctl shows the models --prune deletes, asks, then applies with their digest: a model
    # added meanwhile must not be deleted unseen. The server refuses the whole apply.
    import requests

    from llmgw_runtime.control.admin_api import deleted_digest

    assert ctl(control, "apply", "-f", catalog_file(tmp_path, catalog_yaml("a", "b", "c")))[0] == 0
    auth = {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/yaml"}
    shown = deleted_digest(["b"])                  # what was shown before c was added
    resp = requests.put(f"{control}/api/v1/catalog?prune=true&deletes={shown}",
                        data=catalog_yaml("a"), headers=auth, timeout=10)
    assert resp.status_code == 409, resp.text
    assert "changed since they were shown (now: b, c)" in resp.json()["error"]["message"]
    assert sorted(model_rows(store)) == ["a", "b", "c"]
    resp = requests.put(f"{control}/api/v1/catalog?prune=true&deletes="
                        + deleted_digest(["b", "c"]), data=catalog_yaml("a"), headers=auth,
                        timeout=10)
    assert resp.status_code == 200 and resp.json()["deleted"] == ["b", "c"]
    assert sorted(model_rows(store)) == ["a"]
