"""`llmgw ctl` against a running control service: every listing in a table and as JSON,
apply with bad input, API keys that the router then requires."""

from __future__ import annotations

import json
import os
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner

from llmgw_runtime.cli.ctl import ctl, status_command
from llmgw_runtime.cli.main import cli

from .conftest import Cluster, tiny_catalog

pytestmark = pytest.mark.slow


def run(cluster: Cluster, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(ctl, ["--url", cluster.control_url, "--token",
                                      cluster.admin_token, *args])
    return result.exit_code, result.output


def test_every_listing_has_a_table_and_json(cluster: Cluster) -> None:
    code, out = run(cluster, "models")
    assert code == 0 and "tiny" in out and "ready" in out and "1/1" in out
    code, out = run(cluster, "models", "-o", "json")
    assert json.loads(out)["models"][0]["state"] == "ready"
    code, out = run(cluster, "nodes")
    assert code == 0 and "node1" in out and "cpu" in out and " ok" in out
    assert json.loads(run(cluster, "nodes", "-o", "json")[1])["nodes"][0]["name"] == "node1"
    code, out = run(cluster, "replicas")
    assert code == 0 and "tiny" in out and "ready" in out
    reps = json.loads(run(cluster, "replicas", "-o", "json")[1])["replicas"]
    assert reps[0]["port"] > 0
    code, out = run(cluster, "events")
    assert code == 0 and "place" in out
    assert json.loads(run(cluster, "events", "-o", "json")[1])["events"]
    code, out = run(cluster, "status")
    assert code == 0 and "CLASS" in out and "cpu" in out and "tiny" in out
    status = json.loads(run(cluster, "status", "-o", "json")[1])
    assert status["devices"]["cpu"]["total"] == 1 and status["devices"]["cpu"]["used"] == 1
    code, out = run(cluster, "plan")
    assert code == 0 and "nothing to do" in out
    assert json.loads(run(cluster, "plan", "-o", "json")[1])["starts"] == []


def test_llmgw_status_is_ctl_status(cluster: Cluster) -> None:
    result = CliRunner().invoke(status_command, ["--url", cluster.control_url, "--token",
                                                 cluster.admin_token, "-o", "json"])
    assert result.exit_code == 0 and json.loads(result.output)["nodes"]["total"] == 1


def test_status_json_matches_the_documented_schema_and_text_has_no_colour_off_a_tty(
        cluster: Cluster) -> None:
    import jsonschema

    from llmgw_runtime.status import render

    schema = json.loads((Path(render.__file__).parent / "status.schema.json").read_text())
    code, out = run(cluster, "status", "-o", "json")
    jsonschema.validate(json.loads(out), schema)
    code, out = run(cluster, "status")
    assert code == 0 and "\x1b[" not in out                # CliRunner is not a terminal
    assert "nodes 1/1 reporting" in out and "capacity:" in out
    code, coloured = run(cluster, "status", "--color")
    assert "\x1b[32mready" in coloured
    code, out = run(cluster, "status", "--idle-after", "soon")
    assert code == 2 and "--idle-after" in out and "30m, 1h or 90s" in out
    # the tiny replica was just used or never: with a 1 s threshold it is idle or unknown
    idle = json.loads(run(cluster, "status", "--idle-after", "1s", "-o", "json")[1])["idle"]
    assert idle["after_s"] == 1.0 and len(idle["replicas"] + idle["unknown"]) == 1


@pytest.mark.parametrize("started", ["plainly", "with SIGINT ignored"])
def test_llmgw_status_watch_redraws_until_interrupted(cluster: Cluster, started: str) -> None:
    """Ctrl-C ends the watch, also when it was started with SIGINT ignored (a background
    job of a script; in a rehearsal, a test's child started while something in the test
    process had it so: the watch slept on past its SIGINT)."""
    import shutil
    import signal
    import subprocess
    import sys
    import time

    def ignored() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    exe = shutil.which("llmgw-status", path=str(Path(sys.executable).parent))
    assert exe, "llmgw-status is not installed in the venv (pip install -e .)"
    proc = subprocess.Popen([exe, "--url", cluster.control_url, "--token",
                             cluster.admin_token, "--watch", "--interval", "0.5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"},
                            preexec_fn=ignored if started != "plainly" else None)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        # say where it was (in a rehearsal: asleep between redraws, SIGINT ignored)
        proc.send_signal(signal.SIGABRT)          # faulthandler prints every thread
        out, err = proc.communicate(timeout=10)
        pytest.fail(f"llmgw-status went on 10 s after Ctrl-C; its threads then:\n{err[-4000:]}")
    assert proc.returncode == 0, err
    assert out.count("Ctrl-C ends") >= 2 and out.count("capacity:") >= 2
    assert "Traceback" not in err


def test_apply_reports_every_problem_and_changes_nothing(cluster: Cluster,
                                                        tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - {name: x y, source: rel, engine: tgi, profile: {class: cpu}}\n")
    code, out = run(cluster, "apply", "-f", str(bad))
    assert code == 1
    assert "3 problems; nothing was applied" in out and "engine 'tgi' is unknown" in out
    assert [m["name"] for m in json.loads(run(cluster, "models", "-o", "json")[1])["models"]] \
        == ["tiny"]
    code, out = run(cluster, "apply", "-f", str(tmp_path / "missing.yaml"))
    assert code == 1 and "cannot read the catalog" in out


def test_apply_then_models_shows_the_new_model(cluster: Cluster, tiny_model: Path,
                                               tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(tiny_catalog(tiny_model, name="tiny2", replicas=0))
    code, out = run(cluster, "apply", "-f", str(path))
    assert code == 0 and "model tiny2 created" in out
    code, out = run(cluster, "models")
    assert "tiny2" in out and "stopped" in out


def test_a_router_that_requires_keys_accepts_only_created_ones(cluster: Cluster) -> None:
    cluster.procs["router"].stop()
    cluster.start_router(require_api_key=True)
    url = cluster.router_url + "/v1"
    with pytest.raises(openai.AuthenticationError) as info:
        openai.OpenAI(base_url=url, api_key="sk-wrong", max_retries=0).models.list()
    assert "llmgw ctl keys create" in str(info.value)
    code, out = run(cluster, "keys", "create", "app1")
    assert code == 0 and "shown once" in out
    key = out.strip().splitlines()[-1]
    import time

    time.sleep(1)  # the router's next routes refresh carries the new key's hash
    client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    code, out = run(cluster, "keys", "list")
    assert "app1" in out and key not in out


def test_unreachable_control_service_is_a_clear_error() -> None:
    result = CliRunner().invoke(cli, ["ctl", "--url", "http://127.0.0.1:9", "--token", "t",
                                      "models"])
    assert result.exit_code == 1
    assert "cannot reach the control service at http://127.0.0.1:9" in result.output
