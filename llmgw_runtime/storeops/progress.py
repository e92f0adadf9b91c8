"""A playbook's progress, one line per step, counted up front.

:func:`parse_plan` reads ``ansible-playbook --list-tasks --list-hosts`` (every play, the
hosts it matches and its tasks: the playbooks import their roles statically, so the list
is the whole run). The total counts only the steps that will run and be announced: not
those of a play that matches no host, nor meta tasks (``flush_handlers``: Ansible announces
one only when a handler was notified, :func:`meta_task_names`). :class:`Progress` folds
ansible-runner's event dicts into lines: a listed step is ``[n/total]``, ``n`` counting the
listed steps as they start (it never jumps, and a run that finishes ends at the total), a
step that is not listed (a handler, an included task) is ``[+]``; a handler that Ansible
announces once per host (``throttle``) is one line. A step hidden with ``no_log`` still
says "changed", and when it fails, Ansible's error line (less the secrets) says why. All
pure: fed recorded events in the tests."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import LlmgwError

_HOST_ORDER = ("failed", "unreachable", "changed", "ok", "skipped")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PLAY = re.compile(r"^play #\d+ \((.*)\): (.*?)\s*(\tTAGS: \[.*\])?$")
_HOSTS = re.compile(r"^hosts \((\d+)\):$")
# The actions Ansible runs without a step of their own (a meta task is announced only when
# it has something to do, e.g. flush_handlers with a handler notified).
META_ACTIONS = ("meta", "ansible.builtin.meta", "ansible.legacy.meta")
_ERROR = re.compile(r"\[ERROR\]: (?:Task failed: )?(?:(?:Action|Module) failed: )?(.*)$")
HIDDEN = ("the output is hidden (no_log) and Ansible gave no reason: run "
          "`ansible-playbook -vvv playbooks/store.yml` by hand to see it")


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
    steps: int                  # listed steps that ran (all steps without a plan)
    total: int | None = None    # the steps the plan counted
    handlers: int = 0           # handler lines ([+])
    included: int = 0           # steps not listed that are not handlers ([+])
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
        done = (f"{self.steps} of {self.total} steps"
                if self.total is not None and self.steps != self.total
                else f"{self.steps} steps")
        if self.handlers:
            done += f" and {self.handlers} handler(s)"
        if self.included:
            done += f" and {self.included} included step(s)"
        return f"{done}, {verdict} ({per_host or 'no hosts'})"


@dataclass(frozen=True)
class Plan:
    """The plays of a playbook in order, each with the tasks (``role : task``) that will
    run and be announced (none for a play that matches no host); ``meta``: the names of
    the meta tasks left out (an announcement of one is not a step)."""

    plays: tuple[tuple[str, tuple[str, ...]], ...]
    meta: frozenset[str] = frozenset()

    @property
    def total(self) -> int:
        return sum(len(tasks) for _, tasks in self.plays)

    def is_meta(self, label: str) -> bool:
        return is_named(label, self.meta)


def is_named(label: str, names: frozenset[str]) -> bool:
    """Whether the step ``label`` (``role : task`` or ``task``) is one of ``names``."""
    return label in names or label.partition(" : ")[2] in names


def parse_plan(list_stdout: str, meta: frozenset[str] = frozenset()) -> Plan | None:
    """The plan ``ansible-playbook --list-tasks --list-hosts`` prints, less the tasks of a
    play that matches no host and the tasks named in ``meta`` (None when no task is left).
    Without ``--list-hosts`` every play counts as matching hosts."""
    plays: list[tuple[str, list[str]]] = []
    no_hosts: set[int] = set()
    for raw in list_stdout.splitlines():
        line = raw.strip()
        match = _PLAY.match(line)
        if match:
            plays.append((match[2].strip(), []))
            continue
        hosts = _HOSTS.match(line)
        if hosts and plays and int(hosts[1]) == 0:
            no_hosts.add(len(plays) - 1)
            continue
        label, tab, _ = line.partition("\tTAGS: [")
        if tab and plays and not is_named(label.strip(), meta):
            plays[-1][1].append(label.strip())
    kept = tuple((name, () if i in no_hosts else tuple(tasks))
                 for i, (name, tasks) in enumerate(plays))
    if not any(tasks for _, tasks in kept):
        return None
    return Plan(kept, meta | set(META_ACTIONS))


def meta_task_names(tasks: Any) -> set[str]:
    """The names of the meta tasks in parsed playbook or task-file YAML (any nesting:
    plays, blocks, tasks); handlers are not listed, so theirs are left out."""
    names: set[str] = set()
    if isinstance(tasks, list):
        for item in tasks:
            names |= meta_task_names(item)
    elif isinstance(tasks, dict):
        if any(action in tasks for action in META_ACTIONS) and tasks.get("name"):
            names.add(str(tasks["name"]).strip())
        for key, value in tasks.items():
            if key != "handlers" and isinstance(value, list | dict):
                names |= meta_task_names(value)
    return names


def task_label(event_data: dict[str, Any]) -> str:
    """``role : task`` as ansible prints it."""
    task = str(event_data.get("task") or event_data.get("name") or "?").strip()
    role = event_data.get("role")
    return f"{role} : {task}" if role else task


def failure_message(res: dict[str, Any], stdout: str = "") -> str:
    """The useful part of a failed task's result; for a result hidden with no_log, the
    reason in Ansible's own error line (the caller takes the secrets out)."""
    if "censored" in res:
        for line in _ANSI.sub("", stdout).splitlines():
            found = _ERROR.search(line.strip())
            if found and found[1].strip():
                return found[1].strip()
        return HIDDEN
    for key in ("msg", "stderr", "module_stderr", "reason", "stdout"):
        value = res.get(key)
        if isinstance(value, str) and value.strip():
            lines = value.strip().splitlines()
            return "\n".join(lines[:8]) + (" ..." if len(lines) > 8 else "")
    return "no message (run ansible-playbook by hand with -v for details)"


def redact(text: str, secrets: list[str]) -> str:
    for s in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(s, "***")
    return text


def _rank(result: str) -> int:
    """Failures first, then changes, then the rest."""
    word = result.split()[0].lower()
    return _HOST_ORDER.index(word) if word in _HOST_ORDER else len(_HOST_ORDER)


def _ok_result(res: dict[str, Any], stdout: str) -> str:
    """changed or ok; a no_log result has lost its "changed", Ansible's line has not."""
    if "censored" in res and "changed" not in res:
        return "changed" if _ANSI.sub("", stdout).lstrip().startswith("changed:") else "ok"
    return "changed" if res.get("changed") else "ok"


class Progress:
    """Folds ansible-runner events into one line per step: the line of a step is made when
    the next step starts or the play ends. ``feed`` returns the lines that are complete."""

    def __init__(self, plan: Plan | None = None, secrets: list[str] | None = None) -> None:
        self.plan = plan
        self.total = plan.total if plan else None
        self.secrets = list(secrets or [])
        self.step = 0                   # steps run (listed or not)
        self.listed = 0                 # listed steps run: the n of [n/total]
        self._play = -1
        self._next = 0                  # index in the current play's listed tasks
        self._label: str | None = None
        self._number: str = ""
        self._hosts: dict[str, str] = {}
        self.outcome = Outcome(ok=True, steps=0, total=self.total)
        self._error_lines = 0

    def _flush(self) -> list[str]:
        if self._label is None:
            return []
        results = sorted(self._hosts.items(), key=lambda kv: (_rank(kv[1]), kv[0]))
        hosts = ", ".join(f"{h} {r}" for h, r in results)
        line = redact(f"[{self._number}] {self._label}  {hosts}".rstrip(), self.secrets)
        self._label, self._hosts = None, {}
        return [line]

    def _listed_at(self, label: str) -> int | None:
        """The index of ``label`` among the current play's tasks still to come."""
        if self.plan is None or not 0 <= self._play < len(self.plan.plays):
            return None
        tasks = self.plan.plays[self._play][1]
        for i in range(self._next, len(tasks)):
            if tasks[i] == label:
                return i
        return None

    def _start(self, label: str, handler: bool) -> list[str]:
        if self.plan is not None and self.plan.is_meta(label):
            return self._flush()        # a meta task: Ansible's doing, not a step
        at = self._listed_at(label)
        if at is None and label == self._label:
            return []                   # the same handler again (one host at a time)
        lines = self._flush()
        self.step += 1
        self._label = label
        if at is not None and self.plan is not None:
            self._next = at + 1
            self.listed += 1
            self.outcome.steps = self.listed
            self._number = f"{self.listed}/{self.total}"
        elif self.plan is not None:
            self._number = "+"
            if handler:
                self.outcome.handlers += 1
            else:
                self.outcome.included += 1
        else:
            self.outcome.steps = self.step
            self._number = str(self.step)
        return lines

    def feed(self, event: dict[str, Any]) -> list[str]:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = str(data.get("host") or data.get("remote_addr") or "")
        stdout = str(event.get("stdout") or "")
        if kind == "playbook_on_play_start":
            lines = self._flush()
            self._play += 1
            self._next = 0
            return lines
        if kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
            # ansible-runner announces a handler as a task with is_conditional set.
            return self._start(task_label(data), kind == "playbook_on_handler_task_start"
                               or bool(data.get("is_conditional")))
        res = data.get("res") or {}
        if kind == "runner_on_ok":
            self._hosts[host] = _ok_result(res, stdout)
        elif kind == "runner_on_skipped":
            self._hosts[host] = "skipped"
        elif kind == "runner_on_failed":
            if data.get("ignore_errors"):
                self._hosts[host] = "ok (failure ignored)"
            else:
                self._hosts[host] = "FAILED"
                self.outcome.ok = False
                self.outcome.failures.append(Failure(
                    host, task_label(data),
                    redact(failure_message(res, stdout), self.secrets)))
        elif kind == "runner_on_unreachable":
            self._hosts[host] = "UNREACHABLE"
            self.outcome.ok = False
            self.outcome.failures.append(Failure(
                host, task_label(data), redact(failure_message(res, stdout), self.secrets),
                unreachable=True))
        elif kind == "playbook_on_no_hosts_matched":
            return self._flush()        # the plan left its steps out
        elif kind == "verbose":
            # Ansible's own errors (a bad playbook, a missing role) come as plain output:
            # keep the error line and the few lines after it (where, the source excerpt).
            text = _ANSI.sub("", stdout).rstrip()
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


# What a failed host's message means, and what to do (the first that matches).
_ADVICE = (
    (("Missing sudo password", "a password is required", "sudo: a terminal is required"),
     "USER may not sudo without a password there: log in as root, or give USER "
     "passwordless sudo (/etc/sudoers.d), then "),
    (("python3: not found", "python: not found", "No such file or directory: '/usr/bin/python",
      "interpreter discovery", "/usr/bin/python3: No such file"),
     "Ansible finds no Python there: `apt-get install python3` on that host, then "),
    (("Permission denied (publickey", "Connection refused", "No route to host",
      "Could not resolve hostname", "Connection timed out"),
     "Check that you can `ssh USER@HOST` to the host(s) named without a password prompt, "
     "then "),
)


def advice(outcome: Outcome) -> str:
    """What to do about a failed run (pure)."""
    text = "\n".join(f.message for f in outcome.failures)
    for markers, what in _ADVICE:
        if any(m in text for m in markers):
            return what
    if any(f.unreachable for f in outcome.failures):
        return ("Check that you can `ssh USER@HOST` to the unreachable host(s) without a "
                "password prompt, then ")
    if outcome.failures:
        return "Fix the cause on that host, then "
    return "Fix what ansible-playbook reports, then "


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
    return "\n".join(lines) + "\nNothing was moved: the store in use is unchanged. " \
        f"{advice(outcome)}re-run `{rerun}` (it is safe: steps already done change nothing)."
