"""``llmgw up``'s supervision: the restart policy (delay and message from the exit, how long
the child ran and its failures in a row), the log tail of one run, and the thin shell."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from llmgw_runtime.cli.supervise import (
    RestartPolicy,
    Supervised,
    decide_restart,
    exit_status,
    log_since,
)

POLICY = RestartPolicy(first_delay_s=1.0, max_delay_s=30.0, reset_after_s=60.0)


@pytest.mark.parametrize(("ran_s", "failures", "delay", "failures_after"), [
    (2.0, 0, 1.0, 1),        # first quick failure: the first delay
    (2.0, 1, 2.0, 2),        # doubling ...
    (2.0, 2, 4.0, 3),
    (2.0, 4, 16.0, 5),
    (2.0, 5, 30.0, 6),       # ... capped
    (2.0, 40, 30.0, 41),
    (59.9, 5, 30.0, 6),      # not yet a minute: still backing off
    (60.0, 5, 1.0, 1),       # ran a minute: healthy again, start over
    (3600.0, 12, 1.0, 1),
    (-5.0, 0, 1.0, 1),       # a clock that went backwards counts as no time
])
def test_restart_delay_doubles_on_quick_failures_and_resets_after_a_minute(
        ran_s: float, failures: int, delay: float, failures_after: int) -> None:
    plan = decide_restart(POLICY, "agent", 1, started=100.0, exited=100.0 + ran_s,
                          failures=failures, log_tail=[])
    assert (plan.delay_s, plan.failures) == (delay, failures_after)


@pytest.mark.parametrize(("returncode", "shown"), [
    (0, "exited with code 0"),
    (1, "exited with code 1"),
    (-9, "was killed by SIGKILL (-9)"),
    (-15, "was killed by SIGTERM (-15)"),
    (-11, "was killed by SIGSEGV (-11)"),
    (-200, "was killed by signal 200 (-200)"),
])
def test_exit_status_names_the_code_or_the_signal(returncode: int, shown: str) -> None:
    assert exit_status(returncode) == shown


def test_message_is_one_line_naming_child_status_delay_and_last_log_lines() -> None:
    plan = decide_restart(POLICY, "agent", -9, started=10.0, exited=22.4, failures=1,
                          log_tail=["one", "", "two", "three", "four\x1b[2J"])
    assert plan.message == (
        "llmgw: the agent was killed by SIGKILL (-9) after 12 s; restarting it in 2 s; "
        "last log lines: two | three | four\\x1b[2J")
    assert "\n" not in plan.message


@pytest.mark.parametrize(("tail", "quoted"), [
    ([], "its log of this run is empty"),
    (["  ", ""], "its log of this run is empty"),
    (["Traceback ...", "ValueError: bad"], "last log lines: Traceback ... | ValueError: bad"),
    (["x" * 200], "last log lines: " + "x" * 157 + "..."),
])
def test_message_quotes_the_log_tail_cut_and_sanitised(tail: list[str], quoted: str) -> None:
    plan = decide_restart(POLICY, "router", 3, 0.0, 1.0, 0, tail)
    assert plan.message.endswith("; " + quoted)
    assert plan.message.startswith("llmgw: the router exited with code 3 after 1 s; ")


def test_log_since_reads_only_what_this_run_appended(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text("an earlier run\nits crash\n")
    offset = log.stat().st_size
    assert log_since(log, offset) == []
    with log.open("a") as fh:
        fh.write("this run\nits last words\n")
    assert log_since(log, offset) == ["this run", "its last words"]
    assert log_since(tmp_path / "missing.log", 0) == []


def test_log_since_keeps_the_end_of_a_long_run_and_drops_the_cut_line(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text("old\n" + "".join(f"line {i:04d}\n" for i in range(1000)))
    lines = log_since(log, 4, max_bytes=95)
    assert lines[-1] == "line 0999" and all(len(line) == 9 for line in lines)
    assert len(lines) == 9     # 95 bytes: 9 whole lines of 10 bytes after a cut one


@dataclass
class FakeProcess:
    name: str
    returned: int | None = None
    lines: list[str] = field(default_factory=list)
    reaped: bool = False

    def alive(self) -> bool:
        return self.returned is None

    def returncode(self) -> int:
        return self.returned if self.returned is not None else 0

    def tail_lines(self) -> list[str]:
        return self.lines

    def reap(self) -> None:
        self.reaped = True


def test_shell_says_so_once_waits_the_delay_then_starts_a_fresh_process() -> None:
    started: list[FakeProcess] = []
    said: list[str] = []

    def start() -> FakeProcess:
        started.append(FakeProcess("agent"))
        return started[-1]

    child = Supervised(start, POLICY, said.append, now=0.0)
    child.check(5.0)
    assert len(started) == 1 and said == []

    started[0].returned, started[0].lines = -9, ["reporting"]
    child.check(10.0)
    assert started[0].reaped and len(started) == 1
    assert said == ["llmgw: the agent was killed by SIGKILL (-9) after 10 s; restarting it in "
                    "1 s; last log lines: reporting"]
    child.check(10.5)
    assert len(started) == 1 and len(said) == 1     # said once, still waiting
    child.check(11.0)
    assert len(started) == 2 and child.proc is started[1]

    started[1].returned = 1                          # dies at once again: 2 s
    child.check(12.0)
    assert "restarting it in 2 s" in said[-1]
    child.check(13.9)
    assert len(started) == 2
    child.check(14.0)
    assert len(started) == 3

    started[2].returned = 1                          # after a healthy minute: 1 s again
    child.check(80.0)
    assert "after 66 s; restarting it in 1 s" in said[-1]
