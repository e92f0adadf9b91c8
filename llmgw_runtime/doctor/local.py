"""Which agent the doctor checks: the settings of the agent configured on this machine.

An agent is configured by an env file of ``LLMGW_*`` lines: ``llmgw up`` writes
``<its state dir>/agent.env`` (``./.llmgw`` or ``$LLMGW_STATE_DIR``) and starts its agent
with those settings; the Ansible role writes ``/etc/llmgw/agent.env``, the
``EnvironmentFile`` of ``llmgw-agent.service``. The doctor reads the first that exists
(or the one ``--env-file`` names), so it checks the devices, engines and control service
that agent uses, not the defaults.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..storeops.switch import parse_env

ENV_FILE = "agent.env"                      # in the state directory of `llmgw up`
INSTALLED_ENV_FILE = Path("/etc/llmgw/agent.env")
DEVICE_CHOICES = ("auto", "nvml", "nvidia-smi", "cpu", "none", "fake:FILE")


@dataclass(frozen=True)
class LocalSettings:
    """The agent settings found on this machine."""

    path: Path | None = None                # the env file read; None: none found
    kind: str = ""                          # whose file it is, in words
    values: dict[str, str] = field(default_factory=dict)
    looked: tuple[Path, ...] = ()           # where the doctor looked
    problem: str | None = None              # the file exists but could not be read
    old_up: Path | None = None              # an `llmgw up` state from before agent.env

    def describe(self) -> str:
        """Whose settings the doctor checks, for its first line."""
        if self.path is None or self.problem:
            places = ", ".join(str(p) for p in self.looked) or "nowhere"
            found = (f"{self.path} could not be read" if self.problem else
                     f"no agent settings file found (looked in {places})")
            hint = (f" ({self.old_up} holds an agent of `llmgw up` started before it wrote "
                    "agent.env: start `llmgw up` again, or pass --devices cpu)"
                    if self.old_up is not None else "")
            return f"{found}: checking the defaults and this shell's LLMGW_* variables{hint}"
        return f"checking the agent configured by {self.path} ({self.kind})"


def candidates(up_state_dir: Path, installed: Path = INSTALLED_ENV_FILE,
               ) -> list[tuple[Path, str]]:
    """Env files of a local agent, in the order the doctor tries them."""
    return [(up_state_dir / ENV_FILE, "the agent of `llmgw up`"),
            (installed, "llmgw-agent.service, installed by Ansible")]


def find(given: Path | None, up_state_dir: Path,
         installed: Path = INSTALLED_ENV_FILE) -> LocalSettings:
    """The env file named by ``--env-file``, else the first candidate that exists."""
    tries = [(given, "given with --env-file")] if given is not None else \
        candidates(up_state_dir, installed)
    for path, kind in tries:
        if not path.exists():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            return LocalSettings(path=path, kind=kind, looked=tuple(p for p, _ in tries),
                                 problem=f"cannot read {path} ({kind}): {reason}")
        return LocalSettings(path=path, kind=kind, values=parse_env(text),
                             looked=tuple(p for p, _ in tries))
    old_up = up_state_dir / "agent"
    return LocalSettings(looked=tuple(p for p, _ in tries),
                         old_up=old_up if given is None and old_up.is_dir() else None)


def environment(local: LocalSettings, environ: Mapping[str, str] | None = None,
                ) -> dict[str, str]:
    """What the agent's settings are read from: this shell's ``LLMGW_*`` variables, with
    the env file's values over them (the agent itself sees only the file's)."""
    base = dict(os.environ if environ is None else environ)
    return {**base, **local.values}


def devices_problem(value: str) -> str | None:
    """Why ``value`` is not a device source the agent accepts, or None."""
    kind, sep, arg = value.strip().partition(":")
    choices = ", ".join(DEVICE_CHOICES)
    if kind == "fake":
        return None if arg.strip() else "fake: needs the file that lists the devices " \
                                        "(fake:/path/devices.yaml)"
    if kind not in ("auto", "nvml", "nvidia-smi", "cpu", "none"):
        return f"{value!r} is not a device source; use one of {choices}"
    if sep:
        return f"{kind} takes nothing after ':' (got {value!r}); use one of {choices}"
    return None
