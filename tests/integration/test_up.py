"""`llmgw up`: the all-in-one serves SmolLM2 through the OpenAI API, Ctrl-C leaves no
process behind, a second run reuses the state (and keeps what was applied to the demo
model; the stop was no failed start), and a child that dies is restarted (an agent's
engines keep serving)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
import requests
import yaml
from click.testing import CliRunner

from llmgw_runtime.cli.client import Client
from llmgw_runtime.cli.main import cli
from llmgw_runtime.cli.up_text import own_commands
from tests.integration.conftest import tiny_catalog
from tests.support.procs import LlmgwProcess, descendants, free_port, pid_alive, wait_until

pytestmark = pytest.mark.slow


def start_up(state: Path, control_port: int, router_port: int,
             name: str = "up", extra: list[str] | None = None,
             env: dict[str, str] | None = None) -> LlmgwProcess:
    # Started with SIGINT and SIGQUIT ignored, as a script's background job is (and as a
    # child of a process running C's system() at that moment inherits them): Ctrl-C must
    # stop it all the same. A CI run once left both tests' `up` ignoring it.
    proc = LlmgwProcess(name, ["up", "--control-port", str(control_port),
                               "--router-port", str(router_port), *(extra or [])],
                        {"LLMGW_STATE_DIR": str(state), **(env or {})}, state.parent,
                        ignoring=("INT", "QUIT"))
    wait_until(lambda: "llmgw is up" in proc.log.read_text() or proc.proc.poll() is not None,
               120, "`llmgw up` to say it is up")
    assert proc.proc.poll() is None, proc.tail()
    return proc


def interrupt(up: LlmgwProcess, state: Path, within: float = 60) -> None:
    """Ctrl-C `llmgw up` and wait for it to stop; past ``within``, fail with what each of
    its parts last logged (and kill them all, so the next test does not inherit them)."""
    up.signal(signal.SIGINT)
    try:
        up.proc.wait(within)
    except subprocess.TimeoutExpired:
        tails = "".join(f"\n--- {log.name}:\n" + "\n".join(
            log.read_text(errors="replace").splitlines()[-15:])
            for log in sorted((state / "logs").glob("*.log")))
        left = sorted(descendants(up.pid))
        os.killpg(up.pid, signal.SIGKILL)
        up.proc.wait()
        pytest.fail(f"`llmgw up` did not stop within {within:.0f} s of Ctrl-C (its processes "
                    f"then: {left}):\n{up.tail()}{tails}")


def test_up_serves_the_demo_model_and_ctrl_c_leaves_no_process(tmp_path: Path) -> None:
    state = tmp_path / "state"
    control_port, router_port = free_port(), free_port()
    up = start_up(state, control_port, router_port)
    try:
        banner = up.log.read_text()
        assert f"http://127.0.0.1:{router_port}/v1" in banner and "curl -s" in banner
        admin_token = (state / "secrets" / "admin-token").read_text().strip()
        assert admin_token in banner
        # not the default ports: the banner gives the exact command (with the venv's own
        # llmgw and python: a fresh machine has neither on PATH), and ctl finds this run
        # from the state directory alone (the URL file next to the admin token)
        python, llmgw = own_commands(sys.executable, tmp_path)
        assert f"\n  {llmgw} ctl --url http://127.0.0.1:{control_port} status " in banner
        assert f'\n  {python} -c "import openai;' in banner
        assert "API keys:             not required" in banner
        assert "demo catalog: smollm2-135m-instruct added to this fresh state" in banner
        result = CliRunner().invoke(cli, ["ctl", "status"], env={
            "LLMGW_STATE_DIR": str(state), "LLMGW_CONTROL_URL": None,
            "LLMGW_ADMIN_TOKEN": None})
        assert result.exit_code == 0 and "smollm2-135m-instruct" in result.output, \
            result.output
        console = f"http://127.0.0.1:{control_port}/console/"
        assert console in banner
        assert "Log in" in requests.get(console, timeout=10).text   # the login page
        assert (state / "secrets" / "admin-token").stat().st_mode & 0o077 == 0

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{router_port}/v1", api_key="none",
                               max_retries=0)
        assert [m.id for m in client.models.list().data] == ["smollm2-135m-instruct"]
        reply = client.chat.completions.create(
            model="smollm2-135m-instruct", temperature=0, max_tokens=40,
            messages=[{"role": "user", "content": "Name three colours."}])
        text = reply.choices[0].message.content or ""
        # SmolLM2 answers in English words, not tokens of gibberish.
        assert any(colour in text.lower() for colour in ("red", "blue", "green", "yellow")), text
        stream = client.chat.completions.create(
            model="smollm2-135m-instruct", temperature=0, max_tokens=20, stream=True,
            messages=[{"role": "user", "content": "Say hello."}])
        pieces = [c.choices[0].delta.content for c in stream if c.choices
                  and c.choices[0].delta.content]
        assert len(pieces) > 3 and "".join(pieces).strip()

        admin = Client(f"http://127.0.0.1:{control_port}", admin_token)
        [replica] = admin.get("/api/v1/replicas")["replicas"]
        family = descendants(up.pid) | {replica["pid"]}
        assert len(family) >= 5   # control (master + worker), router, agent, engine
        # an edit to the demo model, as `ctl apply` makes it: the next start keeps it
        demo = yaml.safe_load((state / "catalog.yaml").read_text())
        demo["models"][0]["aliases"] = ["smol"]
        admin.request("PUT", "/api/v1/catalog", yaml.safe_dump(demo).encode(),
                      "application/yaml")
    finally:
        interrupt(up, state)
    assert up.proc.returncode == 0, up.tail()
    said = up.log.read_text()
    assert "llmgw: stopped" in said
    stopping = said[said.index("llmgw: stopping"):]
    assert f"llmgw: stopped 1 engine(s): {replica['id']} (smollm2-135m-instruct)" in stopping
    assert "adopted" not in stopping and "is ready" not in stopping, stopping
    assert not (state / "secrets" / "control-url").exists()   # ctl no longer goes there
    left = [pid for pid in family if pid_alive(pid)]
    assert left == [], f"processes left after Ctrl-C: {left}"

    # Running it again reuses the state: same secrets, same store, the model comes back;
    # this time its router requires API keys (the environment's setting).
    again = start_up(state, control_port, router_port, name="up-again",
                     env={"LLMGW_REQUIRE_API_KEY": "true"})
    try:
        assert (state / "secrets" / "admin-token").read_text().strip() == admin_token
        assert "demo catalog: smollm2-135m-instruct exists, kept as you applied it" in \
            again.log.read_text()
        admin = Client(f"http://127.0.0.1:{control_port}", admin_token)
        events = admin.get("/api/v1/events?limit=500")["events"]
        # created, then the alias: the demo catalog changed nothing at the second start
        assert sum(1 for e in events if e["kind"] == "catalog") == 2, events
        # the Ctrl-C was no failed start: no failure, no backoff, the lost replica replaced
        assert not [e for e in events if e["kind"] in ("failure", "backoff")], events
        assert any(e["kind"] == "lost" and replica["id"] in e["message"] for e in events)
        assert "API keys:             required" in again.log.read_text()
        keyless = openai.OpenAI(base_url=f"http://127.0.0.1:{router_port}/v1",
                                api_key="none", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            keyless.models.list()
        key = admin.post("/api/v1/keys", {"name": "up-test"})["key"]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{router_port}/v1", api_key=key,
                               max_retries=0)
        reply = wait_until(lambda: client.chat.completions.create(
            model="smol", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]),
            15, "a reply to the alias applied before the restart, with a key")
        assert reply.choices[0].message.content is not None
    finally:
        interrupt(again, state)
    assert again.proc.returncode == 0


def child_running(parent: int, command: str) -> int | None:
    """The pid of ``parent``'s child running ``llmgw COMMAND``, if any."""
    for pid in descendants(parent):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and b"llmgw_runtime.cli.main" in argv and \
                argv[argv.index(b"llmgw_runtime.cli.main") + 1] == command.encode():
            return pid
    return None


def test_up_restarts_a_killed_agent_and_its_engine_keeps_serving(
        tmp_path: Path, tiny_model: Path) -> None:
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True, mode=0o700)
    marker = "MARKER-written-before-this-up-started"
    (state / "logs" / "agent.log").write_text(f"an earlier run\n{marker}\n")
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(tiny_catalog(tiny_model))
    control_port, router_port = free_port(), free_port()
    up = start_up(state, control_port, router_port, extra=["--catalog", str(catalog)])
    engine = 0
    try:
        admin = Client(f"http://127.0.0.1:{control_port}",
                       (state / "secrets" / "admin-token").read_text().strip())
        def ready_replica() -> dict[str, Any] | None:
            reps = admin.get("/api/v1/replicas")["replicas"]
            return reps[0] if len(reps) == 1 and reps[0]["state"] == "ready" else None

        engine = wait_until(ready_replica, 60, "the tiny model's replica ready")["pid"]
        agent = child_running(up.pid, "agent")
        assert agent and engine and pid_alive(engine), up.tail()

        os.kill(agent, signal.SIGKILL)
        said = wait_until(lambda: [line for line in up.log.read_text().splitlines()
                                   if line.startswith("llmgw: the agent was killed by")],
                          30, "up to say the agent died")
        assert len(said) == 1 and "SIGKILL (-9)" in said[0] and "restarting it in" in said[0]
        again = wait_until(lambda: (child_running(up.pid, "agent") or 0) not in (0, agent),
                           30, "a new agent")
        assert again
        wait_until(lambda: "adopted 1 running replica" in
                   (state / "logs" / "agent.log").read_text(), 30, "the new agent to adopt")
        assert wait_until(ready_replica, 30, "the adopted replica ready")["pid"] == engine
        assert pid_alive(engine)                  # the same engine process, never restarted

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{router_port}/v1",
                               api_key="none", max_retries=0)
        reply = wait_until(lambda: client.chat.completions.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}]),
            30, "a chat completion after the restart")
        assert reply.choices[0].message.content is not None
        assert marker not in up.log.read_text()    # only this run's log is quoted
        family = descendants(up.pid) | {engine}
    finally:
        interrupt(up, state)
    assert up.proc.returncode == 0, up.tail()
    left = [pid for pid in family if pid_alive(pid)]
    assert left == [], f"processes left after Ctrl-C: {left}"
