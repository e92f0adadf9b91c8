"""The playbook's step counter (issue 28): counted up front from what will run, steady as
it runs, never a "no hosts" line. Fed the events ansible-runner sent for
fixtures/plays.yml (recorded by fixtures/record_events.py): a play no host matches, a
meta task (flush_handlers) with and without a handler notified, an included task file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmgw_runtime.storeops import patroni
from llmgw_runtime.storeops.progress import Progress, meta_task_names, parse_plan
from llmgw_runtime.storeops.runner import LIST_ARGS, ansible_env, meta_tasks, run_playbook

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).resolve().parents[2]


def run(events_file: str) -> tuple[list[str], Progress]:
    plan = parse_plan((FIXTURES / "plays.list.txt").read_text(), meta_tasks(FIXTURES))
    progress = Progress(plan)
    events: list[dict[str, Any]] = json.loads((FIXTURES / events_file).read_text())
    lines = [line for e in events for line in progress.feed(e)] + progress.finish(0)
    return lines, progress


def numbers(lines: list[str]) -> list[tuple[int, int]]:
    return [(int(m[1]), int(m[2])) for m in (re.match(r"\[(\d+)/(\d+)\]", x) for x in lines)
            if m]


def test_the_plan_counts_what_will_run_and_be_announced() -> None:
    plan = parse_plan((FIXTURES / "plays.list.txt").read_text(), meta_tasks(FIXTURES))
    assert plan is not None
    # 7 listed: the meta task and the task of the play no host matches are not steps.
    assert plan.total == 5
    assert [tasks for _, tasks in plan.plays] == [
        ("Look around", "Change something", "Skip on every host", "Include more"), (),
        ("Finish",)]


@pytest.mark.parametrize("events", ["plays.events.json", "plays.unchanged.events.json"])
def test_the_counter_is_steady_and_ends_at_its_total(events: str) -> None:
    lines, progress = run(events)
    assert numbers(lines) == [(n, 5) for n in range(1, 6)], lines
    assert not any("no hosts" in line or "nobody" in line for line in lines), lines
    assert not any("Run the handlers now" in line for line in lines), lines
    assert "[+] Included step  s1 ok, s2 ok, witness ok" in lines
    out = progress.outcome
    assert out.ok and out.steps == out.total == 5 and out.included == 1
    handled = events == "plays.events.json"
    assert ("[+] React to the change  s1 ok, s2 ok, witness ok" in lines) is handled
    assert out.summary().startswith("5 steps and 1 handler(s) and 1 included step(s)"
                                    if handled else "5 steps and 1 included step(s), "
                                                    "nothing changed")


def test_a_stopped_run_says_how_far_it_got() -> None:
    plan = parse_plan((FIXTURES / "plays.list.txt").read_text(), meta_tasks(FIXTURES))
    progress = Progress(plan)
    events = json.loads((FIXTURES / "plays.events.json").read_text())
    cut = next(i for i, e in enumerate(events) if e["event_data"].get("task") == "Skip on "
               "every host")
    for e in events[:cut]:
        progress.feed(e)
    progress.finish(2)
    assert progress.outcome.summary().startswith("2 of 5 steps and 1 handler(s), ")


def test_meta_tasks_are_found_at_any_depth_but_not_among_handlers() -> None:
    doc = yaml.safe_load("""
- hosts: all
  tasks:
    - name: plain
      ansible.builtin.debug: {}
    - block:
        - name: flush in a block
          ansible.builtin.meta: flush_handlers
  handlers:
    - name: a handler meta
      meta: noop
- name: flush at the top
  meta: flush_handlers
""")
    assert meta_task_names(doc) == {"flush in a block", "flush at the top"}


@pytest.mark.skipif(shutil.which("ansible-playbook", path=str(Path(ROOT / ".venv/bin")))
                    is None, reason="ansible-core is not installed")
def test_the_real_store_playbooks_plan_leaves_out_the_control_play_and_flushes(
        tmp_path: Path) -> None:
    """playbooks/store.yml as server init lists it: the control hosts' play matches no host
    (server init's inventory has no llmgw_control) and the roles' flush_handlers are meta."""
    import ansible_runner

    hosts = [patroni.StoreHost("nobody", n) for n in ("s1", "s2")]
    playbooks = ROOT / "playbooks"
    listing = ansible_runner.run(
        private_data_dir=str(tmp_path),
        project_dir=str(playbooks), playbook="store.yml", quiet=True, cmdline=LIST_ARGS,
        inventory=patroni.inventory(hosts, "witness", connection="local"),
        envvars=ansible_env(playbooks))
    text = listing.stdout.read()
    plan = parse_plan(text, meta_tasks(playbooks))
    assert plan is not None
    listed = text.count("\tTAGS: [") - text.count("  play #")
    flushes = {"etcd : Service | start or restart now if the settings changed",
               "patroni : Service | reload Patroni now if its settings changed"}
    assert flushes <= {line.strip().split("\t")[0] for line in text.splitlines()}
    assert plan.total == listed - 1 - len(flushes)
    assert [name for name, tasks in plan.plays if not tasks] == ["store | control hosts' "
                                                                 "addresses"]
    assert not flushes & {t for _, tasks in plan.plays for t in tasks}


def test_a_real_run_counts_the_same_and_a_relative_playbook_path_works(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """plays.yml run for real (as --playbooks given relative to the current directory):
    the lines are those of the recorded events."""
    monkeypatch.chdir(FIXTURES.parent)
    hosts = [patroni.StoreHost("nobody", n) for n in ("s1", "s2")]
    lines: list[str] = []
    outcome = run_playbook(Path("fixtures") / "plays.yml",
                           patroni.inventory(hosts, "witness", connection="local"),
                           {"change": True}, lines.append)
    assert outcome.ok and outcome.steps == outcome.total == 5, outcome
    assert lines == run("plays.events.json")[0]
