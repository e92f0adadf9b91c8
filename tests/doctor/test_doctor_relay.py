"""`llmgw doctor` says which relay loop a router on this node runs, compiled or the
interpreted fallback, and what to do when the compiled one is missing or old."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from llmgw_runtime.doctor.diagnose import ERROR, OK, WARNING, Facts, Finding, diagnose
from llmgw_runtime.doctor.relay_loop import RelayLoop
from tests.router.test_relay_build import can_compile
from tests.support.procs import ROOT

SO = "/opt/llmgw/venv/lib/python3.11/site-packages/llmgw_runtime/router/http/_crelay.so"


def relay_finding(relay: RelayLoop) -> Finding:
    [found] = [f for f in diagnose(Facts(devices_spec="none", relay=relay))
               if f.topic == "router"]
    return found


def test_the_compiled_relay_is_an_ok_line_naming_its_module() -> None:
    found = relay_finding(RelayLoop(kind="compiled", path=SO))
    assert found.level == OK
    assert found.message == f"router relay loop: compiled ({SO})"


def test_the_interpreted_fallback_warns_and_says_how_to_build_the_compiled_one() -> None:
    found = relay_finding(RelayLoop(kind="interpreted", path="/x/_relay.py",
                                    why_not_compiled="the compiled one is not built"))
    assert found.level == WARNING
    assert found.message == "router relay loop: interpreted (the compiled one is not built)"
    assert "build-essential python3-dev" in (found.fix or "") and "reinstall" in (found.fix or "")


def test_the_interpreted_relay_chosen_by_its_setting_is_ok() -> None:
    found = relay_finding(RelayLoop(kind="interpreted", chosen=True,
                                    why_not_compiled="chosen by LLMGW_ROUTER_RELAY=interpreted"))
    assert found.level == OK and "interpreted (chosen by" in found.message


def test_a_compiled_relay_older_than_its_source_warns_to_reinstall() -> None:
    found = relay_finding(RelayLoop(kind="compiled", path=SO, stale=True))
    assert found.level == WARNING and "older relay source" in found.message
    assert "reinstall" in (found.fix or "")


def test_a_refused_setting_is_an_error() -> None:
    found = relay_finding(RelayLoop(problem="LLMGW_ROUTER_RELAY='x': use one of auto, "
                                            "compiled, interpreted"))
    assert found.level == ERROR and "LLMGW_ROUTER_RELAY='x'" in found.message


def doctor_in_subprocess(tmp_path: Path, choice: str) -> dict:  # type: ignore[type-arg]
    """The real `llmgw doctor -o json` (a fresh process: the relay's choice is made at its
    import) under ``LLMGW_ROUTER_RELAY=choice``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env.update(LLMGW_ROUTER_RELAY=choice, LLMGW_STATE_DIR=str(tmp_path),
               PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "llmgw_runtime.cli.main", "doctor",
                           "--devices", "none", "--control-url", "http://127.0.0.1:1",
                           "-o", "json"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=str(tmp_path))
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def relay_line(report: dict) -> str:  # type: ignore[type-arg]
    [line] = [f["message"] for f in report["findings"] if f["topic"] == "router"]
    return str(line)


def test_the_real_doctor_names_the_relay_loop_this_node_runs(tmp_path: Path) -> None:
    line = relay_line(doctor_in_subprocess(tmp_path, "interpreted"))
    assert line == "router relay loop: interpreted (chosen by LLMGW_ROUTER_RELAY=interpreted)"
    line = relay_line(doctor_in_subprocess(tmp_path, "auto"))
    if can_compile():       # where pip had a compiler, it built the compiled one
        assert line.startswith("router relay loop: compiled (") and "_crelay" in line
    else:
        assert line == "router relay loop: interpreted (the compiled one is not built)"
