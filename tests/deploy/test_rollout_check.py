"""The Molecule cluster scenario's rolling-rollout check can fail (issue 15: a fixed 300
requests ended before the second agent restarted, so a restart that dropped every request
would have passed).

The scenario's own pieces, run here on made-up times: molecule/cluster/files/
rollout_requests.py counts a request log, and the assert task of molecule/cluster/verify.yml
(taken from the file, run by ansible-playbook on this machine) judges the counts. A rollout
whose requests were all answered passes; one where a restart dropped requests, the loop
ended before the last restart, or an agent did not restart during the rollout fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "molecule" / "cluster"
CHECK = "Every request succeeded, and requests were answered in every restart window"
START, END = 1_700_000_000.0, 1_700_000_130.0          # the rollout: 130 s
STOPS = {"gpu1": START + 10, "gpu2": START + 75}         # each agent's stop, by systemd

pytestmark = pytest.mark.slow


def systemd_time(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%a %Y-%m-%d %H:%M:%S.%f UTC")


def show(stop: float) -> str:
    """`systemctl show llmgw-agent.service -p ActiveExitTimestamp -p ActiveEnterTimestamp`."""
    return (f"ActiveExitTimestamp={systemd_time(stop)}\n"
            f"ActiveEnterTimestamp={systemd_time(stop + 3)}")


def request_log(path: Path, first: float, last: float,
                code: dict[tuple[float, float], str | None] | None = None) -> Path:
    """A request every 0.25 s from ``first`` to ``last``: 200, or ``code`` inside a span
    (``None``: no request sent then, the loop stalled)."""
    lines, t = [], first
    while t <= last:
        status = next((c for (a, b), c in (code or {}).items() if a <= t < b), "200")
        if status is not None:
            lines.append(f"{t:.3f} {status}")
        t += 0.25
    path.write_text("\n".join(lines) + "\n")
    return path


def count_requests(log: Path, times: dict[str, Any]) -> str:
    """molecule/cluster/files/rollout_requests.py on ``log`` and ``times``: its JSON."""
    done = subprocess.run([sys.executable, str(SCENARIO / "files" / "rollout_requests.py"),
                           str(log), json.dumps(times)],
                          capture_output=True, text=True, check=True, timeout=30)
    return done.stdout


def run_check(tmp_path: Path, play_named: Callable[[dict[str, Any]], bool], check: str,
              variables: dict[str, Any], agents: tuple[str, ...] = ()
              ) -> subprocess.CompletedProcess[str]:
    """The task ``check`` of verify.yml's play that ``play_named`` picks, with that play's
    vars and ``variables``, run by ansible-playbook on this machine (``agents``: the
    llmgw_agents hosts its inventory lists)."""
    [play] = [p for p in yaml.safe_load((SCENARIO / "verify.yml").read_text())
              if play_named(p)]
    [task] = [t for t in play["tasks"] if t.get("name") == check]
    playbook = tmp_path / "check.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "check", "hosts": "localhost", "gather_facts": False,
        "vars": {**play["vars"], **variables}, "tasks": [task]}]))
    inventory = tmp_path / "hosts.yml"
    hosts: dict[str, Any] = {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}
    if agents:
        hosts["children"] = {"llmgw_agents": {"hosts": dict.fromkeys(agents, {})}}
    inventory.write_text(yaml.safe_dump({"all": hosts}))
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                           str(inventory), str(playbook)], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "ANSIBLE_NOCOLOR": "1",
                                            "HOME": str(tmp_path)})


def counted(log: Path, stops: dict[str, float], loop_stopped: float) -> str:
    return count_requests(log, {"rollout": [START, END], "loop_stopped": loop_stopped,
                                "agents": [[name, show(t)] for name, t in stops.items()]})


def judge(tmp_path: Path, stdout: str) -> subprocess.CompletedProcess[str]:
    """verify.yml's assert task (and its play's vars) on ``counted.stdout``."""
    return run_check(tmp_path, lambda p: any(t.get("name") == CHECK for t in p["tasks"]),
                     CHECK, {"rollout_start": START, "rollout_end": END,
                             "counted": {"stdout": stdout}}, agents=("gpu1", "gpu2"))


def test_a_rollout_answered_throughout_passes_and_reports_the_counts(tmp_path: Path) -> None:
    log = request_log(tmp_path / "requests.txt", START - 5, END + 10)
    out = counted(log, STOPS, END + 10)
    summary = json.loads(out)
    assert summary["failed"] == 0
    assert [w["name"] for w in summary["windows"]] == ["gpu1", "gpu2"]
    assert summary["report"][1].startswith("during the 130.0 s rollout: 520 sent, 520 answered")
    assert summary["report"][2].startswith("gpu1 restart window, 65.0 s from its stop (10.0 s "
                                           "into the rollout, running again 3.0 s later)")
    done = judge(tmp_path, out)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("log_from, log_to, dropped, stops, why", [
    # the second agent's restart dropped every request while it was down
    (START - 5, END + 10, {(STOPS["gpu2"], STOPS["gpu2"] + 20): "502"}, STOPS,
     "summary.failed == 0"),
    # the loop ended before the second restart (the fixed 300 requests)
    (START - 5, START + 70, {}, STOPS, "summary.last > rollout_end"),
    # the loop stalled through the second restart: sent nothing, so nothing failed
    (START - 5, END + 10, {(STOPS["gpu2"], END + 9): None}, STOPS,
     "summary.windows | selectattr('answered', 'ge', min_answered_per_window)"),
    # the loop began after the rollout had begun
    (START + 5, END + 10, {}, STOPS, "summary.first < rollout_start"),
    # an agent whose stop time is from before the rollout: it did not restart in it
    (START - 5, END + 10, {}, {"gpu1": START - 60, "gpu2": STOPS["gpu2"]},
     "summary.windows | rejectattr('stopped', 'none') | selectattr('stopped', 'ge'"),
])
def test_a_rollout_the_requests_did_not_get_through_fails(
        tmp_path: Path, log_from: float, log_to: float,
        dropped: dict[tuple[float, float], str | None], stops: dict[str, float], why: str) -> None:
    log = request_log(tmp_path / "requests.txt", log_from, log_to, dropped)
    done = judge(tmp_path, counted(log, stops, log_to))
    assert done.returncode != 0, done.stdout
    assert f'"assertion": "{why}' in done.stdout, done.stdout       # that check, not another
