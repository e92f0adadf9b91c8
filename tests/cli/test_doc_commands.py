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

from llmgw_runtime.cli.ctl import status_command
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


# Before the command on a line that is a command to type: a prompt, env assignments, sudo,
# a path (`.venv/bin/llmgw`). Anything else before it (output, prose) makes it a mention.
TYPED = re.compile(r"^(\$\s+)?((sudo|env)\s+|\w+=\S*\s+)*([\w./~-]*/)?$")


@dataclass(frozen=True)
class Words:
    words: list[str]
    typed: bool          # the line is a command to type, not a mention in output or prose


def command_words(text: str) -> Words:
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
    return Words(out, bool(TYPED.match(text[:match.start(1)].lstrip())))


def _option(command: click.Command, name: str) -> click.Option | None:
    return next((p for p in command.params if isinstance(p, click.Option)
                 and name in (*p.opts, *p.secondary_opts)), None)


def walk(line: Words | list[str]) -> tuple[list[str], str | None]:
    """(the command path, a problem or None) for the words run through the real CLI, by
    click's rules: an option belongs to the command it follows (``llmgw ctl --url X status``,
    not ``llmgw ctl status --url X``), and a command to type gives no more arguments than
    its command takes (placeholders count as arguments)."""
    line = line if isinstance(line, Words) else Words(line, typed=True)
    words = line.words
    command: click.Command = status_command if words[0] == "llmgw-status" else cli
    path = [words[0]]
    positional = 0
    rest = iter(words[1:])
    for word in rest:
        if word.startswith("-") and word != "-":
            names = word.split("=", 1)[0].split("/")       # `--database-url/--state-dir`
            for name in names:
                option = _option(command, name)
                if option is None and name not in ("--help", "-h"):
                    elsewhere = [" ".join(path[:i + 1]) for i, c in enumerate(_chain(path))
                                 if _option(c, name) is not None]
                    where = (f"; it is an option of `{elsewhere[-1]}`: give it before "
                             f"`{path[len(elsewhere[-1].split())]}`" if elsewhere else "")
                    return path, f"{' '.join(path)} has no option {name}{where}"
                takes_value = (option is not None and not option.is_flag
                               and not option.count and "=" not in word and len(names) == 1)
                if takes_value:
                    next(rest, None)
            continue
        if isinstance(command, click.Group):
            sub = command.get_command(click.Context(command), word)
            if sub is not None:
                command = sub
                path.append(word)
                continue
            if PLACEHOLDER.match(word):
                continue
            return path, f"{' '.join(path)} has no subcommand {word!r}"
        positional += 1     # a leaf command's argument (a name, a file, a placeholder)
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    most = None if any(a.nargs < 0 for a in arguments) else sum(a.nargs for a in arguments)
    if line.typed and most is not None and positional > most:
        return path, (f"{' '.join(path)} takes {most} argument{'s' * (most != 1)}, "
                      f"not {positional}")
    return path, None


def _chain(path: list[str]) -> list[click.Command]:
    """The commands along ``path`` (from the top)."""
    command: click.Command = status_command if path[0] == "llmgw-status" else cli
    chain = [command]
    for word in path[1:]:
        assert isinstance(command, click.Group)
        command = command.get_command(click.Context(command), word)  # type: ignore[assignment]
        chain.append(command)
    return chain


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
    # The checker itself: what click would refuse is caught, naming the fix.
    assert walk(["llmgw", "ctl", "apply", "--no-such-flag", "x.yaml"])[1] == \
        "llmgw ctl apply has no option --no-such-flag"
    assert walk(["llmgw", "ctl", "nosuch"])[1] == "llmgw ctl has no subcommand 'nosuch'"
    assert walk(["llmgw", "ctl", "nodes", "delete", "--force", "NAME"])[1] is None
    # A group's option after its subcommand: click refuses it ("No such option").
    assert walk(["llmgw", "ctl", "status", "--url", "http://h:8470"])[1] == (
        "llmgw ctl status has no option --url; it is an option of `llmgw ctl`: give it "
        "before `status`")
    assert walk(["llmgw", "ctl", "--url", "http://h:8470", "status", "-o", "json"])[1] is None
    # llmgw-status is its own program, with ctl's options.
    assert walk(["llmgw-status", "--url", "http://h:8470", "--watch"])[1] is None
    assert walk(["llmgw-status", "--bogus"])[1] == "llmgw-status has no option --bogus"
    # Too many arguments, on a line to type; a mention in output is not a command line.
    assert walk(["llmgw", "ctl", "retry", "a", "b"])[1] == \
        "llmgw ctl retry takes 1 argument, not 2"
    assert walk(["llmgw", "server", "init", "--patroni", "a@h1", "b@h2", "c@h3"])[1] is None
    assert command_words("$ sudo LLMGW_X=1 .venv/bin/llmgw ctl retry M").typed
    assert not command_words("parked (2): llmgw ctl retry MODEL once fixed").typed


def test_each_documented_command_answers_help() -> None:
    runner = CliRunner()
    paths = sorted({tuple(walk(command_words(line.text))[0]) for line in LINES})
    assert ("llmgw-status",) in paths
    for path in paths:
        top = status_command if path[0] == "llmgw-status" else cli
        result = runner.invoke(top, [*path[1:], "--help"], prog_name=path[0])
        assert result.exit_code == 0, (path, result.output)
        assert f"Usage: {' '.join(path)}" in result.output, (path, result.output)
