"""What ``llmgw up`` prints (cli/up_text.py): a banner whose examples run on a fresh machine
as pasted (the venv's python and llmgw, never the system's), whether API keys are required,
one line per waiting model, and the demo catalog that seeds a fresh state only."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from llmgw_runtime.cli.up import up
from llmgw_runtime.cli.up_text import (
    Commands,
    banner,
    demo_seed,
    model_line,
    own_commands,
)

ROUTER = "http://127.0.0.1:8480"
MODELS = [{"name": "smollm2-135m-instruct", "state": "ready", "reason": None}]


def venv(root: Path, with_script: bool = True) -> Path:
    """A virtual environment's bin/ with python (and the llmgw script); returns python."""
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("")
    if with_script:
        (bin_dir / "llmgw").write_text("")
    return bin_dir / "python"


def test_the_commands_shown_are_the_venvs_own(tmp_path: Path) -> None:
    python = venv(tmp_path)
    assert own_commands(str(python), tmp_path) == (".venv/bin/python", ".venv/bin/llmgw")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert own_commands(str(python), elsewhere) == (str(python), str(python.parent / "llmgw"))
    bare = venv(tmp_path / "no-script", with_script=False)
    assert own_commands(str(bare), tmp_path / "no-script") == (
        ".venv/bin/python", ".venv/bin/python -m llmgw_runtime.cli.main")


def shell_lines(text: str) -> list[str]:
    """The banner's commands as a shell reads them (backslash-newline joins lines)."""
    return [line.strip() for line in text.replace("\\\n", "").splitlines() if line.strip()]


def test_the_banner_examples_run_as_pasted_on_a_fresh_machine(tmp_path: Path) -> None:
    python, llmgw = own_commands(str(venv(tmp_path)), tmp_path)
    text = banner(ROUTER, "llmgw-admin-x", MODELS, control_url="http://127.0.0.1:8470",
                  commands=Commands(python, llmgw, f"{llmgw} ctl"), require_key=False)
    lines = shell_lines(text)
    [example] = [line for line in lines if "import openai" in line]
    argv = shlex.split(example)
    assert argv[:2] == [".venv/bin/python", "-c"]          # not the system's python
    compile(argv[2], "<banner>", "exec")                   # the code survives the quoting
    assert "api_key='none'" in argv[2] and "model='smollm2-135m-instruct'" in argv[2]
    assert any(line.startswith(".venv/bin/llmgw ctl status ") for line in lines), text
    assert not any(line.startswith(("llmgw ctl", "python -c")) for line in lines), text
    said = " ".join(text.split())
    assert "API keys: not required: requests without a key are served; start with " \
        "--require-api-key (or LLMGW_REQUIRE_API_KEY=true) to require them" in said
    assert any(line.startswith(".venv/bin/llmgw ctl keys create NAME ") for line in lines)
    [curl] = [line for line in lines if line.startswith("curl ")]
    assert "Authorization" not in curl and shlex.split(curl)[-1].startswith('{"model"')


def test_with_keys_required_the_banner_says_so_and_its_examples_carry_a_key() -> None:
    text = banner(ROUTER, "t", MODELS, control_url="http://127.0.0.1:8470",
                  commands=Commands(".venv/bin/python", ".venv/bin/llmgw",
                                    ".venv/bin/llmgw ctl"), require_key=True)
    lines = shell_lines(text)
    assert "API keys: required: create one (`keys create` below, shown once) and put it " \
        "where the examples say KEY" in " ".join(text.split())
    assert any(line.startswith(".venv/bin/llmgw ctl keys create NAME ") for line in lines)
    [curl] = [line for line in lines if line.startswith("curl ")]
    assert "Authorization: Bearer KEY" in shlex.split(curl)
    assert "api_key='KEY'" in text


def test_up_requires_keys_when_asked_by_flag_or_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert up.make_context("up", []).params["require_api_key"] is False
    assert up.make_context("up", ["--require-api-key"]).params["require_api_key"] is True
    monkeypatch.setenv("LLMGW_REQUIRE_API_KEY", "true")
    assert up.make_context("up", []).params["require_api_key"] is True
    assert up.make_context("up", ["--no-require-api-key"]).params["require_api_key"] is False


ENGINE_LOG = "engine exited with code 2; last log lines:\n" + "\n".join(
    [f"0.00.0{i:02d}.000 I llama_model_loader: - kv {i}: general.name str = x"
     for i in range(18)] + ["model file not found: /srv/m.gguf"])


def test_a_waiting_models_line_is_its_telling_line_and_where_the_whole_text_is() -> None:
    line = model_line({"name": "broken", "state": "parked", "reason": ENGINE_LOG},
                      ".venv/bin/llmgw ctl models -o json")
    assert line == ("llmgw: model broken is parked: engine exited with code 2: model file "
                    "not found: /srv/m.gguf (the engine's last log lines: "
                    ".venv/bin/llmgw ctl models -o json)")
    assert model_line({"name": "m", "state": "unplaceable", "reason": "no cpu node"},
                      "x") == "llmgw: model m is unplaceable: no cpu node"
    assert model_line({"name": "m", "state": "starting", "reason": None}, "x") == \
        "llmgw: model m is starting"


def test_the_demo_catalog_seeds_a_fresh_state_only() -> None:
    demo = ["smollm2-135m-instruct"]
    assert demo_seed([], demo) == (
        True, "demo catalog: smollm2-135m-instruct added to this fresh state")
    seed, line = demo_seed(["smollm2-135m-instruct", "other"], demo)
    assert not seed and line.startswith(
        "demo catalog: smollm2-135m-instruct exists, kept as you applied it")
    seed, line = demo_seed(["mine"], demo)
    assert not seed and "not applied" in line and "(mine)" in line
