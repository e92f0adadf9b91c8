"""A real OpenSSH server for tests: its own host key, a client key made for the test in its
authorized_keys, bound to loopback on a free port, started and stopped by the test.

Needs ``/usr/sbin/sshd`` (Debian's openssh-server, from ``make system-deps``) and root (the
server logs in as the user running the tests, which must be the one running sshd)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")     # sshd refuses to start without it


def missing() -> str | None:
    """Why a real sshd cannot run here, or None."""
    if not SSHD.is_file():
        return f"{SSHD} is missing: apt-get install openssh-server (make system-deps)"
    for tool in ("ssh", "ssh-keygen", "ssh-keyscan"):
        if shutil.which(tool) is None:
            return f"{tool} is missing: apt-get install openssh-client (make system-deps)"
    if os.geteuid() != 0:
        return "sshd must run as root here (it logs the tests' user in as root)"
    return None


def skip_without_sshd() -> None:
    why = missing()
    if why:
        pytest.skip(why)


def _free_port(addresses: tuple[str, ...]) -> int:
    """A TCP port free on every address (one socket on the first is enough on loopback,
    the others are checked by binding)."""
    for _ in range(20):
        with socket.socket() as sock:
            sock.bind((addresses[0], 0))
            port = int(sock.getsockname()[1])
        try:
            for addr in addresses[1:]:
                with socket.socket() as other:
                    other.bind((addr, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port on " + ", ".join(addresses))


def keygen(path: Path, comment: str) -> Path:
    """A fresh ed25519 key pair at ``path`` (and ``path``.pub), no passphrase."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                    "-f", str(path)], check=True, capture_output=True)
    return path


def known_hosts_line(host: str, port: int, public_key: Path) -> str:
    """A known_hosts entry naming ``[host]:port`` with the key in ``public_key``."""
    kind, blob = public_key.read_text().split()[:2]
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {kind} {blob}\n"


@dataclass
class Sshd:
    """A running sshd. ``host_key`` is its public host key, ``client_key`` the private key
    it lets in as any user (root here)."""

    addresses: tuple[str, ...]
    port: int
    dir: Path
    host_key: Path
    client_key: Path
    proc: subprocess.Popen[bytes]

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"

    def known_hosts(self, path: Path, *, keys: dict[str, Path] | None = None) -> Path:
        """Write a known_hosts file at ``path`` with, for each address, the key given in
        ``keys`` (its public key file) or this server's own host key."""
        keys = keys or {}
        path.write_text("".join(known_hosts_line(a, self.port, keys.get(a, self.host_key))
                                for a in self.addresses))
        return path

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


def _wait_listening(server: Sshd, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"sshd exited ({server.proc.returncode}):\n{server.log_text()}")
        try:
            with socket.create_connection((server.addresses[0], server.port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen within {timeout:.0f} s:\n{server.log_text()}")


@contextmanager
def running_sshd(workdir: Path,
                 addresses: tuple[str, ...] = ("127.0.0.1",)) -> Iterator[Sshd]:
    """Start ``sshd -D -e -f CONFIG`` on ``addresses`` (loopback) and a free port; stop it
    (and wait for it) at the end."""
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = keygen(workdir / "ssh_host_ed25519_key", "llmgw-test-host")
    client_key = keygen(workdir / "client_ed25519", "llmgw-test-client")
    authorized = workdir / "authorized_keys"
    authorized.write_text((workdir / "client_ed25519.pub").read_text())
    port = _free_port(addresses)
    config = workdir / "sshd_config"
    config.write_text(
        f"Port {port}\n"
        + "".join(f"ListenAddress {a}\n" for a in addresses)
        + f"HostKey {host_key}\n"
        f"AuthorizedKeysFile {authorized}\n"
        f"PidFile {workdir / 'sshd.pid'}\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "PermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "X11Forwarding no\n"
        "PrintMotd no\n"
        "Subsystem sftp internal-sftp\n"
        "LogLevel VERBOSE\n")
    PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    log = open(workdir / "sshd.log", "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    server = Sshd(addresses, port, workdir, workdir / "ssh_host_ed25519_key.pub",
                  client_key, proc)
    try:
        _wait_listening(server)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A real sshd on 127.0.0.1 and 127.0.0.2 (two store hosts, one server) for a module.
    Use it from a test module with ``from tests.support.sshd import sshd  # noqa: F401``."""
    skip_without_sshd()
    with running_sshd(tmp_path_factory.mktemp("sshd"), ("127.0.0.1", "127.0.0.2")) as server:
        yield server
