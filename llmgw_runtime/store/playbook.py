"""Running a playbook through ansible-runner with one line per step.

:class:`Progress` folds ansible-runner's event dicts into lines (pure, fed sample events in
the tests); :func:`run_playbook` is the thin shell around ``ansible_runner.run``."""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import LlmgwError

_HOST_ORDER = ("failed", "unreachable", "changed", "ok", "skipped")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class PlaybookError(LlmgwError):
    reason = "playbook_failed"


@dataclass(frozen=True)
class Failure:
    host: str
    task: str
    message: str
    unreachable: bool = False


@dataclass
class Outcome:
    """What a whole run did."""

    ok: bool
    steps: int
    changed: dict[str, int] = field(default_factory=dict)
    oks: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)   # ansible's own ERROR! lines

    @property
    def changed_total(self) -> int:
        return sum(self.changed.values())

    def summary(self) -> str:
        hosts = sorted(set(self.oks) | set(self.changed))
        per_host = ", ".join(f"{h} ok={self.oks.get(h, 0)} changed={self.changed.get(h, 0)}"
                             for h in hosts)
        verdict = ("nothing changed" if self.changed_total == 0
                   else f"{self.changed_total} change(s)")
        return f"{self.steps} steps, {verdict} ({per_host or 'no hosts'})"


def task_label(event_data: dict[str, Any]) -> str:
    """``role : task`` as ansible prints it."""
    task = str(event_data.get("task") or event_data.get("name") or "?").strip()
    role = event_data.get("role")
    return f"{role} : {task}" if role else task


def failure_message(res: dict[str, Any]) -> str:
    """The useful part of a failed task's result."""
    for key in ("msg", "stderr", "module_stderr", "reason", "stdout", "censored"):
        value = res.get(key)
        if isinstance(value, str) and value.strip():
            lines = value.strip().splitlines()
            return "\n".join(lines[:8]) + (" ..." if len(lines) > 8 else "")
    return "no message (run ansible-playbook by hand with -v for details)"


def redact(text: str, secrets: list[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def _rank(result: str) -> int:
    """Failures first, then changes, then the rest."""
    word = result.split()[0].lower()
    return _HOST_ORDER.index(word) if word in _HOST_ORDER else len(_HOST_ORDER)


class Progress:
    """Folds ansible-runner events into one line per step: the line of a step is made when
    the next step starts or the play ends. ``feed`` returns the lines that are complete."""

    def __init__(self, listed: list[str] | None = None,
                 secrets: list[str] | None = None) -> None:
        # The total counts the listed tasks plus each unlisted one that runs (tasks of a
        # dynamic include, handlers), so [n/total] never runs past its end.
        self._unseen = Counter(listed or [])
        self.total = len(listed) if listed else None
        self.secrets = list(secrets or [])
        self.step = 0
        self._label: str | None = None
        self._hosts: dict[str, str] = {}
        self.outcome = Outcome(ok=True, steps=0)
        self._error_lines = 0

    def _flush(self) -> list[str]:
        if self._label is None:
            return []
        count = f"{self.step}/{self.total}" if self.total else str(self.step)
        results = sorted(self._hosts.items(), key=lambda kv: (_rank(kv[1]), kv[0]))
        hosts = ", ".join(f"{h} {r}" for h, r in results) or "no hosts"
        line = redact(f"[{count}] {self._label}  {hosts}", self.secrets)
        self._label, self._hosts = None, {}
        return [line]

    def feed(self, event: dict[str, Any]) -> list[str]:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = str(data.get("host") or data.get("remote_addr") or "")
        if kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
            lines = self._flush()
            self.step += 1
            self.outcome.steps = self.step
            self._label = task_label(data)
            if self._unseen[self._label] > 0:
                self._unseen[self._label] -= 1
            elif self.total is not None:
                self.total += 1
            return lines
        if kind == "runner_on_ok":
            res = data.get("res") or {}
            self._hosts[host] = "changed" if res.get("changed") else "ok"
        elif kind == "runner_on_skipped":
            self._hosts[host] = "skipped"
        elif kind == "runner_on_failed":
            res = data.get("res") or {}
            if data.get("ignore_errors"):
                self._hosts[host] = "ok (failure ignored)"
            else:
                self._hosts[host] = "FAILED"
                self.outcome.ok = False
                self.outcome.failures.append(Failure(
                    host, task_label(data), redact(failure_message(res), self.secrets)))
        elif kind == "runner_on_unreachable":
            res = data.get("res") or {}
            self._hosts[host] = "UNREACHABLE"
            self.outcome.ok = False
            self.outcome.failures.append(Failure(
                host, task_label(data), redact(failure_message(res), self.secrets),
                unreachable=True))
        elif kind == "playbook_on_no_hosts_matched":
            lines = self._flush()
            play = str(data.get("play") or "").strip()
            return lines + [f"(play {play + ' ' if play else ''}skipped: no hosts match)"]
        elif kind == "verbose":
            # Ansible's own errors (a bad playbook, a missing role) come as plain output:
            # keep the error line and the few lines after it (where, the source excerpt).
            text = _ANSI.sub("", str(event.get("stdout") or "")).rstrip()
            if text.lstrip().startswith(("ERROR!", "[ERROR]")):
                self._error_lines = 8
            if self._error_lines > 0 and text.strip():
                self._error_lines -= 1
                self.outcome.errors.append(redact(text, self.secrets))
        elif kind == "playbook_on_stats":
            lines = self._flush()
            self.outcome.changed = {h: int(n) for h, n in (data.get("changed") or {}).items()}
            self.outcome.oks = {h: int(n) for h, n in (data.get("ok") or {}).items()}
            return lines
        return []

    def finish(self, rc: int) -> list[str]:
        """The remaining line; a non-zero exit without a failed task is still a failure."""
        lines = self._flush()
        if rc != 0:
            self.outcome.ok = False
        return lines


def listed_tasks(list_tasks_stdout: str) -> list[str] | None:
    """The tasks ``ansible-playbook --list-tasks`` lists, as ``role : task`` (None when
    there are none to read)."""
    out = []
    for line in list_tasks_stdout.splitlines():
        label, tab, _ = line.strip().partition("\tTAGS: [")
        if tab and not label.startswith("play #"):
            out.append(label.strip())
    return out or None


def failure_report(outcome: Outcome, rerun: str) -> str:
    """What failed, where, and what to do."""
    lines = []
    for f in outcome.failures:
        what = "cannot be reached" if f.unreachable else "failed"
        lines.append(f"{f.host}: step '{f.task}' {what}: {f.message}")
    if outcome.errors:
        lines.append("ansible-playbook stopped:")
        lines += [f"  {e}" for e in outcome.errors]
    if not lines:
        lines.append("ansible-playbook stopped with an error and no failed step "
                     "(run it by hand with -v to see why)")
    if any(f.unreachable for f in outcome.failures):
        hint = ("Check that you can `ssh USER@HOST` to the unreachable host(s) without a "
                "password prompt, then ")
    elif outcome.failures:
        hint = "Fix the cause on that host, then "
    else:
        hint = "Fix what ansible-playbook reports, then "
    return "\n".join(lines) + f"\nNothing was moved: the store in use is unchanged. {hint}" \
        f"re-run `{rerun}` (it is safe: steps already done change nothing)."


def _ansible_env(playbook_dir: Path) -> dict[str, str]:
    """PATH with this Python's ansible-playbook first; the project's ansible.cfg (roles,
    collections) when the playbooks dir sits in the repository."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                    os.environ.get("PATH", "")]),
           "ANSIBLE_PYTHON_INTERPRETER": "auto_silent", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_RETRY_FILES_ENABLED": "false"}
    cfg = playbook_dir.parent / "ansible.cfg"
    if cfg.is_file():
        env["ANSIBLE_CONFIG"] = str(cfg)
    return env


def _check_ansible(env: dict[str, str]) -> None:
    if shutil.which("ansible-playbook", path=env["PATH"]) is None:
        raise PlaybookError("ansible-playbook is not installed next to llmgw: install "
                            "ansible-core and ansible-runner in llmgw's Python "
                            "(pip install ansible-core ansible-runner)")


def run_playbook(playbook: Path, inventory: dict[str, Any], extravars: dict[str, Any],
                 echo: Callable[[str], None], secrets: list[str] | None = None) -> Outcome:
    """Run ``playbook`` with ansible-runner, echoing one line per step. The private data
    dir (it holds the extra vars: the passwords) is 0700 and removed afterwards."""
    import ansible_runner

    env = _ansible_env(playbook.parent)
    _check_ansible(env)
    private = Path(tempfile.mkdtemp(prefix="llmgw-store-init-"))
    os.chmod(private, 0o700)
    for sub in ("list", "run"):
        (private / sub).mkdir(mode=0o700)
    try:
        listed = None
        listing = ansible_runner.run(
            private_data_dir=str(private / "list"), project_dir=str(playbook.parent),
            playbook=playbook.name, inventory=inventory, extravars=extravars,
            cmdline="--list-tasks", quiet=True, envvars=env)
        if listing.rc == 0:
            listed = listed_tasks(listing.stdout.read())
        progress = Progress(listed=listed, secrets=secrets)

        def handler(event: dict[str, Any]) -> bool:
            for line in progress.feed(event):
                echo(line)
            return False          # do not keep the event in the artifacts dir

        result = ansible_runner.run(
            private_data_dir=str(private / "run"), project_dir=str(playbook.parent),
            playbook=playbook.name, inventory=inventory, extravars=extravars,
            event_handler=handler, quiet=True, envvars=env)
        for line in progress.finish(int(result.rc or 0)):
            echo(line)
        return progress.outcome
    finally:
        shutil.rmtree(private, ignore_errors=True)
