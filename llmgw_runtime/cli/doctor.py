"""``llmgw doctor``: what this node can run, and what to do about what is wrong."""

from __future__ import annotations

import json
import logging
import os
import sys
from typing import Any

import click

from .. import settings
from ..agent.config import AgentConfig
from ..devices.model import Discovery
from ..doctor.diagnose import ERROR, OK, WARNING, Facts, Finding, diagnose, exit_code
from ..doctor.gather import gather
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
        "nvml": _discovery(facts.nvml),
        "nvidia_smi": _discovery(facts.nvidia_smi),
        "other": _discovery(facts.other),
        "engines": facts.engines,
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


@click.command()
@click.option("--control-url", default=None, help="the control service [LLMGW_CONTROL_URL]")
@click.option("--devices", default=None, help="auto | nvml | nvidia-smi | cpu | fake:FILE")
@click.option("-o", "--output", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
def doctor(control_url: str | None, devices: str | None, fmt: str) -> None:
    """Check this node: driver, NVML and nvidia-smi, MIG, health, engines, weights, control.

    Exit code 0: all good; 1: warnings; 2: errors."""
    try:
        # The doctor needs no join token; without a URL it asks the local default.
        url = control_url or os.environ.get("LLMGW_CONTROL_URL") or DEFAULT_CONTROL_URL
        config = settings.load(AgentConfig, control_url=url, devices=devices,
                               join_token="(not needed by the doctor)")
    except LlmgwError as exc:
        raise click.ClickException(str(exc)) from None
    # Each source's own warnings become findings below; do not print them twice.
    logging.getLogger("llmgw_runtime.devices").setLevel(logging.ERROR)
    facts = gather(config)
    findings = diagnose(facts)
    if fmt == "json":
        click.echo(json.dumps(report_json(facts, findings), indent=2))
    else:
        click.echo(render(findings, colour=sys.stdout.isatty()))
    sys.exit(exit_code(findings))
