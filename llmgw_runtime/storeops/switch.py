"""Pointing the control service at another store: its store env file and its service.

The database URL has one owner per install. The llmgw_control role writes
``/etc/llmgw/control.env`` (its template, every setting); ``server init`` writes
``/etc/llmgw/store.env`` next to it (the URL of the cluster and where its members answer),
a file the role never templates. The unit reads store.env after control.env
(``EnvironmentFile=-``), so its values win, and the role reads it from the host for its own
checks: a later ``site.yml`` run keeps the cluster. Env files are read and rewritten by
pure functions that keep every other line; :func:`write_env_file` replaces one atomically,
keeping its owner and never widening its mode. The service is behind
:class:`ServiceControl`: systemd when there is one, :class:`NoServiceManager` otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from ..errors import LlmgwError

DATABASE_KEY = "LLMGW_DATABASE_URL"
PATRONI_KEY = "LLMGW_PATRONI_URLS"
ETCD_KEY = "LLMGW_ETCD_URLS"
STORE_ENV = "store.env"
UNIT = "llmgw-control"
STORE_ENV_HEADER = ("# Written by `llmgw server init`: the control service's store. The\n"
                    "# llmgw_control role never templates this file; llmgw-control.service\n"
                    "# reads it after control.env, so these values win. docs/store.md\n")


def store_env_path(env_file: Path) -> Path:
    """``store.env`` next to the control service's env file."""
    return env_file.with_name(STORE_ENV)


def store_env_text(current: str, values: dict[str, str]) -> str:
    """The store env file with ``values`` set, every other line kept (pure)."""
    text = current if current.strip() else STORE_ENV_HEADER
    for key, value in values.items():
        text = set_env(text, key, value)
    return text


class SwitchError(LlmgwError):
    reason = "store_switch_failed"


def parse_env(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines (``export`` and quotes allowed, comments skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#") or "=" not in s:
            continue
        key, _, value = s.removeprefix("export ").partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def set_env(text: str, key: str, value: str) -> str:
    """``text`` with ``key`` set to ``value``: the first line of that key is replaced,
    later ones dropped, every other line kept as it is; appended when absent."""
    lines = text.splitlines()
    out: list[str] = []
    done = False
    for line in lines:
        s = line.strip().removeprefix("export ").lstrip()
        if "=" in s and s.split("=", 1)[0].strip() == key:
            if not done:
                out.append(f"{key}={value}")
                done = True
            continue
        out.append(line)
    if not done:
        out.append(f"{key}={value}")
    return "\n".join(out) + "\n"


def write_env_file(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``: a new file is 0600; an existing file
    keeps its owner, group and mode, less any bits for others."""
    mode = 0o600
    owner: tuple[int, int] | None = None
    if path.exists():
        st = path.stat()
        mode = st.st_mode & 0o770
        owner = (st.st_uid, st.st_gid)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.llmgw-tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if owner is not None and os.geteuid() == 0:
            os.chown(tmp, *owner)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def check_writable(path: Path) -> str | None:
    """Why the env file could not be rewritten, or None (asked before anything moves)."""
    where = path.parent
    while not where.exists():
        where = where.parent
    if not os.access(where, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return (f"{path} cannot be written by this user: run `llmgw server init` as root "
                "(or as the owner of the file and its directory)")
    return None


class ServiceControl:
    """Stopping and starting the control service."""

    def is_active(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def hint(self) -> str:
        """The command an operator runs to (re)start it."""
        return f"systemctl restart {UNIT}"


class Systemd(ServiceControl):
    def __init__(self, unit: str = UNIT, systemctl: str = "systemctl") -> None:
        self.unit = unit
        self.systemctl = systemctl

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.systemctl, *args, self.unit], capture_output=True,
                              text=True, timeout=120, check=False)

    def is_active(self) -> bool:
        try:
            return self._run("is-active", "--quiet").returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def _do(self, verb: str) -> None:
        done = self._run(verb)
        if done.returncode != 0:
            raise SwitchError(f"`systemctl {verb} {self.unit}` failed: "
                              f"{(done.stderr or done.stdout).strip() or done.returncode}; "
                              f"see `journalctl -u {self.unit}`")

    def stop(self) -> None:
        self._do("stop")

    def start(self) -> None:
        self._do("start")

    def hint(self) -> str:
        return f"systemctl restart {self.unit}"


class NoServiceManager(ServiceControl):
    """No systemd here: nothing is ever active; the operator restarts by hand."""

    def is_active(self) -> bool:
        return False

    def stop(self) -> None:
        pass

    def start(self) -> None:
        pass

    def hint(self) -> str:
        return f"restart `llmgw server` however you run it (with systemd: systemctl restart {UNIT})"


def service_control() -> ServiceControl:
    return Systemd() if shutil.which("systemctl") and Path("/run/systemd/system").is_dir() \
        else NoServiceManager()
