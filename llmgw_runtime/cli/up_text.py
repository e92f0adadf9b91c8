"""What ``llmgw up`` says: the banner, a model's one line while it waits, the demo catalog's
seed decision, and the commands it shows (the ones this install's user can run as printed).
Pure, except :func:`own_commands`, which looks whether the venv's ``llmgw`` script exists."""

from __future__ import annotations

import json
import os
import shlex
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..status.telling import lines_of, telling_line

DEMO_MODEL = "smollm2-135m-instruct"
KEY_PLACEHOLDER = "KEY"            # where the examples want an API key when keys are required


@dataclass(frozen=True)
class Commands:
    """How a user at a shell runs this install's Python and llmgw, and ctl against this
    run (``ctl``: ``[LLMGW_STATE_DIR=...] LLMGW ctl [--url ...]``, without a subcommand)."""

    python: str
    llmgw: str
    ctl: str


def shown_path(path: str, cwd: Path) -> str:
    """``path`` as typed at ``cwd``: relative when below it (``.venv/bin/python``: what the
    README says), else absolute; quoted for the shell when it must be."""
    full = Path(os.path.abspath(path))
    try:
        text = str(full.relative_to(cwd))
    except ValueError:
        text = str(full)
    return shlex.quote(text)


def own_commands(executable: str, cwd: Path) -> tuple[str, str]:
    """This install's python and llmgw as a user types them: the venv's own
    (``.venv/bin/python``, ``.venv/bin/llmgw``), never a bare ``python``/``llmgw`` that a
    fresh machine resolves to the system's Python or to nothing."""
    python = shown_path(executable, cwd)
    script = Path(os.path.abspath(executable)).parent / "llmgw"
    llmgw = shown_path(str(script), cwd) if script.is_file() \
        else f"{python} -m llmgw_runtime.cli.main"
    return python, llmgw


def demo_seed(existing: Sequence[str], seeded: Sequence[str]) -> tuple[bool, str]:
    """Whether ``up`` (given no --catalog) applies its demo catalog, which names
    ``seeded``, to a store holding the models ``existing``, and the line it prints. It
    seeds a fresh state only: a model that exists is never updated nor deleted (an edit
    applied with ``ctl apply`` stays as applied)."""
    names = ", ".join(seeded) or "no model"
    if not existing:
        return True, f"demo catalog: {names} added to this fresh state"
    kept = [name for name in seeded if name in existing]
    if kept:
        return False, (f"demo catalog: {', '.join(kept)} exist{'s' if len(kept) == 1 else ''}"
                       ", kept as you applied it (the demo catalog only seeds a fresh state;"
                       " `ctl apply` changes models)")
    return False, (f"demo catalog: not applied, this state has models already "
                   f"({', '.join(sorted(existing)[:5])}{', ...' if len(existing) > 5 else ''}"
                   "); the demo catalog only seeds a fresh state")


def model_line(model: dict[str, Any], whole_text: str) -> str:
    """``up``'s line for a model while it waits: its state and the telling line of its
    reason (status/telling.py, as ``ctl status`` shows it), then where the whole text (the
    engine's last log lines) is when the line is not all of it."""
    line = f"llmgw: model {model['name']} is {model['state']}"
    reason = model.get("reason")
    if not reason or not reason.strip():
        return line
    told = telling_line(reason)
    more = "" if lines_of(reason) == [told] else f" (the engine's last log lines: {whole_text})"
    return f"{line}: {told}{more}"


def keys_line(require_key: bool) -> str:
    """The banner's word on API keys (how to create one is on its own line below it)."""
    if require_key:
        return (f"required: create one (`keys create` below, shown once) and put it where "
                f"the examples say {KEY_PLACEHOLDER}")
    return ("not required: requests without a key are served; start with "
            "--require-api-key (or LLMGW_REQUIRE_API_KEY=true) to require them")


def banner(router_url: str, admin_token: str, models: list[dict[str, Any]], *,
           control_url: str, commands: Commands, require_key: bool) -> str:
    """What ``up`` prints once its models are decided: where everything is and examples
    that work when pasted into a shell on this machine."""
    name = next((m["name"] for m in models if m["state"] == "ready"),
                models[0]["name"] if models else DEMO_MODEL)
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "Hello!"}]})
    key = KEY_PLACEHOLDER if require_key else "none"
    auth = f"-H 'Authorization: Bearer {key}' " if require_key else ""
    ctl = commands.ctl
    keys = ("\n" + " " * 24).join(textwrap.wrap(keys_line(require_key), 70,
                                               break_on_hyphens=False))
    return f"""
llmgw is up.
  router (OpenAI API):  {router_url}/v1
  admin token:          {admin_token}
  web console:          {control_url}/console/  (log in with the admin token)
  API keys:             {keys}
  models:               {', '.join(m['name'] + ' (' + m['state'] + ')' for m in models)}

Try it:
  curl -s {router_url}/v1/chat/completions -H 'Content-Type: application/json' \\
       {auth}-d '{body}'

  {commands.python} -c "import openai; c = openai.OpenAI(base_url='{router_url}/v1', \\
api_key='{key}'); print(c.chat.completions.create(model='{name}', \\
messages=[{{'role': 'user', 'content': 'Hello!'}}]).choices[0].message.content)"

  {ctl} status        (the admin token and URL are read from the state directory)
  {ctl} keys create NAME        (an API key, shown once)
A process that dies is restarted; Ctrl-C stops everything.
"""
