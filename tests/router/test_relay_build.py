"""The relay loop, compiled and interpreted: pip builds ``_crelay`` from ``_relay.py`` where
a C compiler and Python's headers are (setup.py), ``LLMGW_ROUTER_RELAY`` chooses, and the
router says at start which one runs."""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support.procs import ROOT, LlmgwProcess, free_port, wait_until

HTTP = ROOT / "llmgw_runtime" / "router" / "http"
REBUILD = "rebuild it: `make` (or .venv/bin/pip install -e .)"


def can_compile() -> bool:
    include = sysconfig.get_paths()["include"]
    return shutil.which("gcc") is not None and (Path(include) / "Python.h").is_file()


needs_compiler = pytest.mark.skipif(not can_compile(), reason="no C compiler or Python.h "
                                    "here: pip built no compiled relay to test")


def relay_in_subprocess(choice: str) -> subprocess.CompletedProcess[str]:
    """Import the relay's choice in a fresh interpreter under ``LLMGW_ROUTER_RELAY=choice``."""
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_ROUTER_RELAY"}
    env.update(LLMGW_ROUTER_RELAY=choice, PYTHONPATH=str(ROOT))
    code = ("from llmgw_runtime.router.http import relay; "
            "print(relay.KIND, relay.impl.__name__)")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60, cwd=str(ROOT))


@needs_compiler
def test_pip_built_the_compiled_relay_as_an_extension_module_of_the_current_source() -> None:
    crelay = importlib.import_module("llmgw_runtime.router.http._crelay")
    assert crelay.__file__ is not None and crelay.__file__.endswith(".so")
    assert isinstance(crelay.__loader__, importlib.machinery.ExtensionFileLoader)
    source = (HTTP / "_relay.py").read_bytes()
    assert crelay.SOURCE_SHA256 == hashlib.sha256(source).hexdigest(), (
        f"the compiled relay was built from an older _relay.py: {REBUILD}")


@needs_compiler
def test_both_relays_load_in_one_process_with_the_same_names() -> None:
    interpreted = importlib.import_module("llmgw_runtime.router.http._relay")
    compiled = importlib.import_module("llmgw_runtime.router.http._crelay")
    assert interpreted is not compiled
    defined = {name for name, value in vars(interpreted).items()
               if getattr(value, "__module__", None) == interpreted.__name__}
    assert defined and defined <= set(vars(compiled))


def test_interpreted_is_chosen_by_its_setting() -> None:
    done = relay_in_subprocess("interpreted")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["interpreted", "llmgw_runtime.router.http._relay"]


@needs_compiler
def test_compiled_is_chosen_by_its_setting_and_by_default() -> None:
    for choice in ("compiled", "auto", ""):
        done = relay_in_subprocess(choice)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["compiled", "llmgw_runtime.router.http._crelay"]


@pytest.mark.skipif(can_compile(), reason="a compiler is here: the compiled relay is built")
def test_compiled_without_a_build_refuses_and_names_the_fix() -> None:
    done = relay_in_subprocess("compiled")
    assert done.returncode != 0
    assert "build-essential python3-dev" in done.stderr


def test_an_unknown_setting_is_refused_with_the_choices() -> None:
    done = relay_in_subprocess("bogus")
    assert done.returncode != 0
    assert "LLMGW_ROUTER_RELAY='bogus': use one of auto, compiled, interpreted" in done.stderr


def router_log(tmp_path: Path, choice: str) -> tuple[LlmgwProcess, str]:
    """``llmgw router`` under ``LLMGW_ROUTER_RELAY=choice``, until it said which relay loop
    runs or exited; its log so far."""
    router = LlmgwProcess("router", ["router", "--host", "127.0.0.1", "--port",
                                     str(free_port()), "--workers", "1"],
                          {"LLMGW_CONTROL_URL": "http://127.0.0.1:1",
                           "LLMGW_ROUTER_TOKEN": "llmgw-router-relay-test-0123456789", "LLMGW_ROUTER_RELAY": choice},
                          tmp_path)
    try:
        wait_until(lambda: "relay loop" in router.log.read_text(errors="replace")
                   or router.proc.poll() is not None, timeout=60,
                   what="the router's start-up log")
    finally:
        router.stop()
    return router, router.log.read_text(errors="replace")


def test_the_router_says_at_start_which_relay_loop_runs(tmp_path: Path) -> None:
    (tmp_path / "interpreted").mkdir()
    _, log = router_log(tmp_path / "interpreted", "interpreted")
    assert "relay loop: interpreted (chosen by LLMGW_ROUTER_RELAY=interpreted)" in log
    if can_compile():
        (tmp_path / "auto").mkdir()
        _, log = router_log(tmp_path / "auto", "auto")
        assert "relay loop: compiled (" in log and "_crelay" in log


def test_the_router_refuses_an_unknown_setting_at_start(tmp_path: Path) -> None:
    router, log = router_log(tmp_path, "bogus")
    assert router.proc.returncode not in (0, None)
    assert "LLMGW_ROUTER_RELAY='bogus': use one of auto, compiled, interpreted" in log
