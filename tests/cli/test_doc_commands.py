"""Every `llmgw` command line shown in README.md and docs/ parses against the real CLI.

Docs and code drifted before (a flag renamed, a subcommand that never existed): this reads
each command line from the fenced blocks and the inline code of the docs, walks it through
the real click groups, and fails naming the file, the line and the word the CLI does not
know. Each command path a doc uses must also answer ``--help``.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from llmgw_runtime.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"^(\.\.\.|…|[A-Z][A-Z0-9_@]*(\.\.\.)?|<[^>]+>|\[.*\])$")
START = re.compile(r"(?:^|[\s/]|\$ )(llmgw(?:-status)?)(?=\s|$)")


@dataclass(frozen=True)
class Line:
    where: str
    text: str


def doc_lines() -> list[Line]:
    """Command lines from fenced blocks (backslash continuations joined) and inline code."""
    found: list[Line] = []
    for path in DOCS:
        rel = path.relative_to(ROOT)
        fenced, pending, start = False, "", 0
        for number, raw in enumerate(path.read_text().splitlines(), 1):
            if raw.lstrip().startswith("```"):
                fenced, pending = not fenced, ""
                continue
            if fenced:
                if not pending:
                    start = number
                pending += raw.rstrip().removesuffix("\\") + " "
                if raw.rstrip().endswith("\\"):
                    continue
                text, pending = pending.strip(), ""
                if START.search(text.split("#", 1)[0]):
                    found.append(Line(f"{rel}:{start}", text))
                continue
            for span in re.findall(r"`([^`]+)`", raw):
                if re.match(r"llmgw(-status)?(\s|$)", span):
                    found.append(Line(f"{rel}:{number}", span))
    return found


def command_words(text: str) -> list[str]:
    """The words of the first llmgw command on the line: after env assignments and `$ `,
    up to a pipe, `&&`, `;`, a redirection or a comment."""
    text = text.split(" #", 1)[0]
    match = START.search(text)
    assert match is not None
    try:
        words = shlex.split(text[match.start(1):])
    except ValueError:
        words = text[match.start(1):].split()
    out: list[str] = []
    for word in words:
        if word in ("|", "&&", ";", "||", ">", "2>&1", "&") or word.startswith((">", "2>")):
            break
        out.append(word)
    return out


def walk(words: list[str]) -> tuple[list[str], str | None]:
    """(the command path, a problem or None) for ``words`` run through the real CLI."""
    if words[0] == "llmgw-status":
        words = ["llmgw", "ctl", "status", *words[1:]]
    command: click.Command = cli
    path = ["llmgw"]
    chain: list[click.Command] = [cli]
    rest = iter(words[1:])
    for word in rest:
        if word.startswith("-") and word != "-":
            names = word.split("=", 1)[0].split("/")       # `--database-url/--state-dir`
            for name in names:
                option = next((p for c in reversed(chain) for p in c.params
                               if isinstance(p, click.Option)
                               and name in (*p.opts, *p.secondary_opts)), None)
                if option is None and name not in ("--help", "-h"):
                    return path, f"{' '.join(path)} has no option {name}"
                takes_value = (option is not None and not option.is_flag
                               and not option.count and "=" not in word and len(names) == 1)
                if takes_value:
                    next(rest, None)
            continue
        if isinstance(command, click.Group):
            sub = command.get_command(click.Context(command), word)
            if sub is not None:
                command = sub
                chain.append(sub)
                path.append(word)
                continue
            if PLACEHOLDER.match(word):
                continue
            return path, f"{' '.join(path)} has no subcommand {word!r}"
        # a leaf command's arguments (names, files, placeholders) are not checked here
    return path, None


LINES = doc_lines()


def test_the_docs_show_commands() -> None:
    # The reader below must keep finding them: an empty list would pass everything.
    assert len(LINES) >= 30
    paths = {" ".join(walk(command_words(line.text))[0]) for line in LINES}
    assert {"llmgw up", "llmgw ctl status", "llmgw ctl apply", "llmgw server init",
            "llmgw doctor", "llmgw agent", "llmgw router"} <= paths


@pytest.mark.parametrize("line", LINES, ids=[f"{line.where}" for line in LINES])
def test_every_command_line_in_the_docs_parses(line: Line) -> None:
    _, problem = walk(command_words(line.text))
    assert problem is None, f"{line.where}: `{line.text}`: {problem}"


def test_the_walk_finds_what_is_wrong() -> None:
    # The checker itself: a renamed flag and a missing subcommand are caught.
    assert walk(["llmgw", "ctl", "apply", "--no-such-flag", "x.yaml"])[1] == \
        "llmgw ctl apply has no option --no-such-flag"
    assert walk(["llmgw", "ctl", "nosuch"])[1] == "llmgw ctl has no subcommand 'nosuch'"
    assert walk(["llmgw", "ctl", "nodes", "delete", "--force", "NAME"])[1] is None


def test_each_documented_command_answers_help() -> None:
    runner = CliRunner()
    paths = sorted({tuple(walk(command_words(line.text))[0]) for line in LINES})
    for path in paths:
        result = runner.invoke(cli, [*path[1:], "--help"], prog_name="llmgw")
        assert result.exit_code == 0, (path, result.output)
        assert f"Usage: {' '.join(path)}" in result.output, (path, result.output)
