"""Running a playbook through ansible-runner, one line per step (:mod:`.progress`), over ssh
that checks every host's key (:mod:`.ssh`).

:func:`local_problems` is the first preflight of ``server init``: what this control host
must have before any host is touched (ansible-runner, ansible-playbook, the collections the
roles use), all from one install, ``pip install 'llmgw[server-init]'``. ansible-runner is
imported here only, inside :func:`run_playbook`: agents and routers install llmgw without
the extra and never load it."""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .progress import Outcome, PlaybookError, Progress, meta_task_names, parse_plan
from .ssh import SshTrust

INSTALL = "pip install 'llmgw[server-init]'"
# The collections the store's roles use besides ansible.builtin (roles/patroni/tasks).
COLLECTIONS = ("community.postgresql",)
# Ansible's default ssh_args, kept after ours: ssh takes the first value it is given for an
# option, so nothing later (not even ANSIBLE_HOST_KEY_CHECKING=False, which appends
# StrictHostKeyChecking=no) can turn the check off.
_ANSIBLE_SSH_ARGS = ["-C", "-o", "ControlMaster=auto", "-o", "ControlPersist=60s"]
# The plan: every play's tasks and the hosts it matches (a play matching none runs nothing).
LIST_ARGS = "--list-tasks --list-hosts"


def ansible_env(playbook_dir: Path, ssh: SshTrust | None = None) -> dict[str, str]:
    """PATH with this Python's ansible-playbook first; the project's ansible.cfg (roles,
    collections) when the playbooks dir sits in the repository; ssh host key checking on
    (ansible-runner turns it off unless told) and strict, first in ssh's arguments."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                    os.environ.get("PATH", "")]),
           "ANSIBLE_PYTHON_INTERPRETER": "auto_silent", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_RETRY_FILES_ENABLED": "false",
           "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_SSH_HOST_KEY_CHECKING": "True",
           "ANSIBLE_SSH_ARGS": shlex.join((ssh or SshTrust()).options()
                                          + _ANSIBLE_SSH_ARGS)}
    cfg = playbook_dir.parent / "ansible.cfg"
    if cfg.is_file():
        env["ANSIBLE_CONFIG"] = str(cfg)
    return env


def collection_roots(playbook_dir: Path) -> list[Path]:
    """Where ansible-playbook looks for collections: the repository's collections/ (its
    ansible.cfg), ANSIBLE_COLLECTIONS_PATH, the user's and the system's, and this Python's
    paths (the ``ansible`` package installs its collections into site-packages)."""
    roots = [playbook_dir.parent / "collections"]
    for value in (os.environ.get("ANSIBLE_COLLECTIONS_PATH", ""),
                  os.environ.get("ANSIBLE_COLLECTIONS_PATHS", "")):
        roots += [Path(p) for p in value.split(os.pathsep) if p]
    roots += [Path("~/.ansible/collections").expanduser(),
              Path("/usr/share/ansible/collections")]
    roots += [Path(p) for p in sys.path if p]
    return roots


def missing_collections(names: Iterable[str], roots: Iterable[Path]) -> list[str]:
    """The collections of ``names`` found under none of ``roots``."""
    roots = list(roots)
    missing = []
    for name in names:
        namespace, _, collection = name.partition(".")
        if not any((r / "ansible_collections" / namespace / collection).is_dir()
                   for r in roots):
            missing.append(name)
    return missing


def judge_local(have_runner: bool, ansible_playbook: str | None,
                missing: list[str]) -> list[str]:
    """What this control host lacks to run the store playbook (pure); each names the fix."""
    lacks = []
    if not have_runner:
        lacks.append("the Python package ansible-runner")
    if ansible_playbook is None:
        lacks.append("ansible-playbook (the Python package ansible-core), next to llmgw")
    lacks += [f"the Ansible collection {name} (the Python package ansible bundles it)"
              for name in missing]
    if not lacks:
        return []
    return [f"this control host lacks {', '.join(lacks)}: install the server-init extra "
            f"into llmgw's Python, `{sys.executable} -m {INSTALL}` "
            f"({INSTALL}), then re-run"]


def local_problems(playbook_dir: Path) -> list[str]:
    """:func:`judge_local` of this host, for the playbooks in ``playbook_dir``."""
    env = ansible_env(playbook_dir)
    return judge_local(importlib.util.find_spec("ansible_runner") is not None,
                       shutil.which("ansible-playbook", path=env["PATH"]),
                       missing_collections(COLLECTIONS, collection_roots(playbook_dir)))


def meta_tasks(playbook_dir: Path) -> frozenset[str]:
    """The names of the meta tasks in the playbooks of ``playbook_dir`` and the task files
    of the roles next to it (``../roles/*/tasks``): the plan leaves them out."""
    import yaml

    files = [*playbook_dir.glob("*.yml"), *playbook_dir.parent.glob("roles/*/tasks/**/*.yml")]
    names: set[str] = set()
    for path in files:
        try:
            names |= meta_task_names(yaml.safe_load(path.read_text()))
        except (OSError, yaml.YAMLError):
            continue                    # ansible-playbook says what is wrong with it
    return frozenset(names)


def run_playbook(playbook: Path, inventory: dict[str, Any], extravars: dict[str, Any],
                 echo: Callable[[str], None], secrets: list[str] | None = None,
                 ssh: SshTrust | None = None) -> Outcome:
    """Run ``playbook`` with ansible-runner, echoing one line per step, ssh checking each
    host's key as ``ssh`` says (strictly, against ssh's own known_hosts by default). The
    steps are counted first (``--list-tasks``). The private data dir (it holds the extra
    vars: the passwords) is 0700 and removed afterwards; ssh's shared connections live in
    it, so none is reused from elsewhere."""
    playbook = playbook.expanduser().absolute()   # ansible runs in its own directory
    env = ansible_env(playbook.parent, ssh)
    if shutil.which("ansible-playbook", path=env["PATH"]) is None or \
            importlib.util.find_spec("ansible_runner") is None:
        raise PlaybookError("ansible-playbook or ansible-runner is not installed next to "
                            f"llmgw: {INSTALL}")
    import ansible_runner

    private = Path(tempfile.mkdtemp(prefix="llmgw-store-init-"))
    os.chmod(private, 0o700)
    for sub in ("list", "run", "cp"):
        (private / sub).mkdir(mode=0o700)
    env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(private / "cp")
    try:
        listing = ansible_runner.run(
            private_data_dir=str(private / "list"), project_dir=str(playbook.parent),
            playbook=playbook.name, inventory=inventory, extravars=extravars,
            cmdline=LIST_ARGS, quiet=True, envvars=env)
        plan = (parse_plan(listing.stdout.read(), meta_tasks(playbook.parent))
                if listing.rc == 0 else None)
        progress = Progress(plan=plan, secrets=secrets)

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
        _close_shared_connections(private / "cp")
        shutil.rmtree(private, ignore_errors=True)


def _close_shared_connections(control_dir: Path) -> None:
    """End the run's ssh master connections (ControlPersist would keep them a minute)."""
    for sock in control_dir.iterdir() if control_dir.is_dir() else ():
        try:
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "llmgw-store"],
                           capture_output=True, timeout=10, check=False,
                           stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            pass
