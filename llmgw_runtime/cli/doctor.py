"""``llmgw doctor``: what this node can run, and what to do about what is wrong."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click

from .. import settings
from ..agent.config import AgentConfig
from ..control.config import default_state_dir
from ..devices.model import Discovery
from ..doctor.diagnose import ERROR, OK, WARNING, Facts, Finding, diagnose, exit_code
from ..doctor.gather import gather
from ..doctor.local import LocalSettings, devices_problem, environment, find
from ..errors import LlmgwError

DEFAULT_CONTROL_URL = "http://127.0.0.1:8470"
MARKS = {OK: "ok  ", WARNING: "WARN", ERROR: "FAIL"}
COLOURS = {OK: "green", WARNING: "yellow", ERROR: "red"}


def _discovery(found: Discovery | None) -> dict[str, Any] | None:
    if found is None:
        return None
    return {"source": found.source, "driver_version": found.driver_version,
            "devices": found.to_dicts(), "cards": [c.to_dict() for c in found.cards],
            "problems": found.problems}


def report_json(facts: Facts, findings: list[Finding]) -> dict[str, Any]:
    return {
        "exit_code": exit_code(findings),
        "findings": [f.to_dict() for f in findings],
        "devices_spec": facts.devices_spec,
        "devices": facts.devices,
        "settings": facts.settings_from,
        "nvml": _discovery(facts.nvml),
        "nvidia_smi": _discovery(facts.nvidia_smi),
        "other": _discovery(facts.other),
        "engines": facts.engines,
        "llama_cpp": facts.llama_cpp.to_dict() if facts.llama_cpp else None,
        "weights": [w.__dict__ for w in facts.weights],
        "control": {"url": facts.control_url, "ok": facts.control_ok,
                    "detail": facts.control_detail},
    }


def render(findings: list[Finding], colour: bool) -> str:
    lines = []
    for f in findings:
        mark = MARKS[f.level]
        if colour:
            mark = click.style(mark, fg=COLOURS[f.level], bold=f.level != OK)
        lines.append(f"{mark} [{f.topic}] {f.message}")
        if f.fix and f.level != OK:
            lines.append(f"       what to do: {f.fix}")
    code = exit_code(findings)
    verdict = {0: "all good", 1: "warnings: this node works, but see above",
               2: "errors: this node cannot serve until they are fixed"}[code]
    return "\n".join(lines + ["", verdict])


def _devices_option(_ctx: click.Context, _param: click.Parameter,
                    value: str | None) -> str | None:
    problem = None if value is None else devices_problem(value)
    if problem:
        raise click.BadParameter(problem)
    return value


def _config(local: LocalSettings, control_url: str | None, devices: str | None,
            ) -> tuple[AgentConfig | None, list[Finding]]:
    """The agent's settings as the agent would read them, or findings naming what is wrong
    with them (never the name of a class)."""
    env = environment(local)
    url = control_url or env.get("LLMGW_CONTROL_URL") or DEFAULT_CONTROL_URL
    try:
        # The doctor needs no join token.
        return settings.load(AgentConfig, env=env, control_url=url, devices=devices,
                             join_token="(not needed by the doctor)"), []
    except LlmgwError as exc:
        where = str(local.path) if local.path is not None and not local.problem \
            else "this shell's LLMGW_* variables"
        fix = f"fix it in {where}, or override it with the doctor's options"
        return None, [Finding(ERROR, "settings", f"the agent's settings are not valid: {d}",
                              fix) for d in exc.details or [exc.message]]


@click.command()
@click.option("--control-url", default=None,
              help="the control service [the agent's LLMGW_CONTROL_URL]")
@click.option("--devices", default=None, callback=_devices_option,
              help="auto | nvml | nvidia-smi | cpu | none | fake:FILE [the agent's "
                   "LLMGW_DEVICES]")
@click.option("--env-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="the agent's settings [<llmgw up state dir>/agent.env, "
                                 "else /etc/llmgw/agent.env]")
@click.option("-o", "--output", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def doctor(control_url: str | None, devices: str | None, env_file: Path | None,
           fmt: str) -> None:
    """Check this node as its agent is configured: driver, NVML and nvidia-smi, MIG, health,
    engines, weights, control.

    Exit code 0: all good; 1: warnings; 2: errors (a node with no usable device is one)."""
    local = find(env_file, default_state_dir())
    config, findings = _config(local, control_url, devices)
    # Each source's own warnings become findings below; do not print them twice.
    logging.getLogger("llmgw_runtime.devices").setLevel(logging.ERROR)
    if config is None:
        facts = Facts(devices_spec=(devices or "").partition(":")[0], devices=devices or "",
                      settings_from=local.describe(), settings_problem=local.problem)
    else:
        facts = gather(config, local=local)
        findings = diagnose(facts)
    if fmt == "json":
        click.echo(json.dumps(report_json(facts, findings), indent=2))
    else:
        click.echo(render(findings, colour=sys.stdout.isatty()))
    sys.exit(exit_code(findings))
