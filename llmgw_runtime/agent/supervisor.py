"""Start, watch, stop and re-adopt engine processes on this node.

Every engine runs in its own session (``start_new_session``), so an agent that dies or
restarts leaves it running; ``run_dir/<replica_id>.json`` records what the next agent needs
to find it again (pid + the process start time from ``/proc``, a guard against pid reuse).
Its output goes to ``run_dir/<replica_id>.log``; the last lines become ``last_error``
when it fails.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3

from ..api.states import ReportedState
from ..engines import EngineDriver
from ..engines.base import DEVICE_VARIABLES, LaunchSpec, peers_of
from ..errors import LlmgwError
from ..weights.fetch import FetchManager
from .procs import free_port, pid_alive, proc_start_time, tail_lines

log = logging.getLogger(__name__)

FETCHING, STARTING, READY, FAILED, STOPPED = (
    ReportedState.FETCHING, ReportedState.STARTING, ReportedState.READY, ReportedState.FAILED,
    ReportedState.STOPPED)
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def inherited_env(environ: Mapping[str, str]) -> dict[str, str]:
    """What an engine inherits from the agent: no llmgw secret (``LLMGW_*``) and no device
    selection of its own (CUDA/Vulkan/ROCm visibility), so only llmgw picks its devices;
    a MIG replica never sees a Vulkan device variable."""
    return {k: v for k, v in environ.items()
            if not k.startswith("LLMGW_") and k not in DEVICE_VARIABLES}


@dataclass
class Replica:
    """One engine process this agent runs (or tried to)."""

    replica_id: str
    model: str
    engine: str
    host: str
    port: int | None = None
    pid: int | None = None
    proc_start: int | None = None
    argv: list[str] = field(default_factory=list)
    health_path: str = "/health"
    started: float = 0.0
    since: float = 0.0
    state: str = STARTING
    last_error: str | None = None
    popen: subprocess.Popen[bytes] | None = None
    health: str = "http"                 # http | tcp | process (engines.base.LaunchSpec)
    assignment: Mapping[str, Any] | None = None   # kept until the engine is launched
    progress: dict[str, Any] | None = None        # while fetching its weights

    def to_state(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.replica_id, "model": self.model, "state": self.state,
               "port": self.port, "pid": self.pid, "last_error": self.last_error}
        if self.state == FETCHING and self.progress is not None:
            out["progress"] = self.progress
        return out


class Supervisor:
    """Owns the engine processes of one node. Not thread-safe: one loop drives it."""

    def __init__(self, run_dir: str | Path, drivers: Mapping[str, EngineDriver], *,
                 host: str = "127.0.0.1", weights_dirs: Sequence[str | Path] = (),
                 start_timeout_s: float = 120.0, stop_grace_s: float = 10.0,
                 health_timeout_s: float = 1.0, clock: Callable[[], float] = time.time,
                 fetch_dir: str | Path | None = None, hf_token: str | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.drivers = dict(drivers)
        self.host = host
        # Weights are looked for in the configured directories and downloaded into the first
        # writable one; with none usable, into ``fetch_dir`` (next to the run directory).
        fallback = Path(fetch_dir or self.run_dir.parent / "weights")
        self.weights_dirs = [str(d) for d in weights_dirs] + [str(fallback)]
        self._configured_dirs = [str(d) for d in weights_dirs]
        self.fetches = FetchManager(fallback_dir=fallback)
        self.hf_token = hf_token
        self.health_timeout_s = health_timeout_s
        self._downloaded = False
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.clock = clock
        self._http = urllib3.PoolManager(
            retries=False, timeout=urllib3.Timeout(total=health_timeout_s))
        self._replicas: dict[str, Replica] = {}

    # -- files -------------------------------------------------------------------------
    def log_path(self, replica_id: str) -> Path:
        return self.run_dir / f"{replica_id}.log"

    def record_path(self, replica_id: str) -> Path:
        return self.run_dir / f"{replica_id}.json"

    def _write_record(self, rep: Replica) -> None:
        record = {"replica_id": rep.replica_id, "model": rep.model, "engine": rep.engine,
                  "pid": rep.pid, "port": rep.port, "host": rep.host, "argv": rep.argv,
                  "health_path": rep.health_path, "health": rep.health,
                  "started": rep.started, "proc_start": rep.proc_start}
        path = self.record_path(rep.replica_id)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(tmp, path)

    def _remove_files(self, replica_id: str, *, keep_log: bool = False) -> None:
        paths = [self.record_path(replica_id)]
        if not keep_log:
            paths.append(self.log_path(replica_id))
        for path in paths:
            try:
                path.unlink()
            except FileNotFoundError:
                pass

    # -- start -------------------------------------------------------------------------
    def start(self, assignment: Mapping[str, Any]) -> dict[str, Any]:
        """Start the engine of ``assignment`` (docs/api.md): fetch its weights when this node
        has none, wait for the peers it needs, then launch. A replica that cannot start is
        recorded as failed with the reason. Returns its state."""
        rid = str(assignment["replica_id"])
        if rid in self._replicas:
            return self._replicas[rid].to_state()
        now = self.clock()
        rep = Replica(replica_id=rid, model=str(assignment.get("model", "")),
                      engine=str(assignment.get("engine", "")), host=self.host, started=now,
                      since=now, assignment=assignment)
        self._replicas[rid] = rep
        self._advance(rep)
        return rep.to_state()

    def _advance(self, rep: Replica) -> None:
        """Move a replica that has no process yet along: weights, peers, launch."""
        assignment = rep.assignment
        assert assignment is not None
        try:
            driver = self.drivers.get(rep.engine)
            if driver is None:
                raise LlmgwError(f"engine {rep.engine!r} is not installed on this node "
                                 f"(installed: {', '.join(sorted(self.drivers)) or 'none'})")
            source = str(assignment.get("source", ""))
            fetch = None if source.startswith(("file://", "/")) else self.fetches.ensure(
                rep.replica_id, source, self._configured_dirs,
                sha256=assignment.get("sha256"), size_bytes=assignment.get("size_bytes"),
                token=self.hf_token)
            # file:// is used in place: the engine says best what is wrong with the file
            if fetch is None:
                pass
            elif fetch.state == "fetching":
                rep.state, rep.progress = FETCHING, fetch.progress()
                return
            elif fetch.state == "failed":
                self.fetches.forget(rep.replica_id)
                raise LlmgwError(fetch.error or "fetching the weights failed")
            else:
                self.fetches.forget(rep.replica_id)
            if rep.state == FETCHING:
                self._downloaded = True
            rep.state, rep.progress = STARTING, None
            if assignment.get("role") == "worker":
                spec = driver.launch_worker(assignment, weights_dirs=self.weights_dirs)
                rep.port = spec.port
                if spec.health == "tcp":
                    rep.host = dict(peers_of(assignment)).get(int(assignment["rank"]),
                                                              self.host)
            else:
                rep.port = rep.port or free_port(self.host)
                spec = driver.launch(assignment, host=self.host, port=rep.port,
                                     weights_dirs=self.weights_dirs)
            missing = [f"{h}:{p}" for h, p in spec.wait_for if not self._accepts(h, p)]
            if missing:
                if self.clock() - rep.since > self.start_timeout_s:
                    raise LlmgwError(f"the workers {', '.join(missing)} did not accept "
                                     f"connections within {self.start_timeout_s:g} s")
                rep.last_error = f"waiting for workers: {', '.join(missing)}"
                return
            self._launch(rep, spec)
        except (LlmgwError, OSError, KeyError, ValueError) as exc:
            message = exc.message if isinstance(exc, LlmgwError) else str(exc)
            if rep.popen is not None:
                self._terminate(rep)
            rep.state, rep.last_error, rep.assignment = FAILED, message, None
            log.warning("replica %s (%s) cannot start: %s", rep.replica_id, rep.model, message)

    def _launch(self, rep: Replica, spec: LaunchSpec) -> None:
        rid = rep.replica_id
        rep.argv, rep.health_path, rep.health = list(spec.argv), spec.health_path, spec.health
        rep.last_error = None
        env = inherited_env(os.environ)
        env.update(spec.env)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")) if p)
        now = self.clock()
        with open(self.log_path(rid), "ab") as logf:
            logf.write(f"--- llmgw: starting {rid} ({rep.model}) at {time.ctime(now)}: "
                       f"{' '.join(spec.argv)}\n".encode())
            logf.flush()
            rep.popen = subprocess.Popen(
                spec.argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                env=env, cwd=str(self.run_dir), start_new_session=True, close_fds=True)
        rep.pid = rep.popen.pid
        rep.proc_start = proc_start_time(rep.pid)
        rep.since, rep.assignment = now, None
        self._write_record(rep)
        log.info("started replica %s (%s, %s) pid %s port %s", rid, rep.model, rep.engine,
                 rep.pid, rep.port)

    def _accepts(self, host: str, port: int) -> bool:
        try:
            with socket.create_connection((host, port), timeout=self.health_timeout_s):
                return True
        except OSError:
            return False

    # -- watch -------------------------------------------------------------------------
    def _alive(self, rep: Replica) -> bool:
        if rep.popen is not None:
            return rep.popen.poll() is None
        return rep.pid is not None and pid_alive(rep.pid, rep.proc_start)

    def _healthy(self, rep: Replica) -> bool:
        if rep.health == "process":
            return True
        if rep.health == "tcp":
            return rep.port is not None and self._accepts(rep.host, rep.port)
        url = f"http://{rep.host}:{rep.port}{rep.health_path}"
        try:
            return int(self._http.request("GET", url).status) == 200
        except urllib3.exceptions.HTTPError:
            return False

    def _fail(self, rep: Replica, why: str) -> None:
        self._terminate(rep)
        # Only this start's lines: the log keeps every start's, and an older start's error
        # would read as this one's.
        tail = tail_lines(self.log_path(rep.replica_id))
        tail = tail[max(tail.rfind("--- llmgw: starting "), 0):]
        rep.state = FAILED
        rep.last_error = f"{why}; last log lines:\n{tail}" if tail else why
        self._remove_files(rep.replica_id, keep_log=True)
        log.warning("replica %s (%s) failed: %s", rep.replica_id, rep.model, why)

    def refresh(self) -> None:
        """Move each replica along: starting -> ready on health 200; failed when the
        process exits or is not healthy within the start timeout."""
        for rep in list(self._replicas.values()):
            if rep.assignment is not None and rep.state in (FETCHING, STARTING):
                self._advance(rep)          # not launched yet: weights or peers pending
                continue
            if rep.state not in (STARTING, READY):
                continue
            if not self._alive(rep):
                code = rep.popen.returncode if rep.popen is not None else None
                why = "engine exited" + (f" with code {code}" if code is not None else "")
                self._fail(rep, why)
            elif rep.state == STARTING:
                if self._healthy(rep):
                    rep.state = READY
                    log.info("replica %s (%s) is ready on port %s", rep.replica_id,
                             rep.model, rep.port)
                elif self.clock() - rep.since > self.start_timeout_s:
                    self._fail(rep, f"engine not healthy after {self.start_timeout_s:g} s")

    def states(self) -> list[dict[str, Any]]:
        """The replica states to report (docs/api.md), refreshed now."""
        self.refresh()
        return [rep.to_state() for rep in self._replicas.values()]

    def downloads_finished(self) -> bool:
        """Whether a download completed since the last call (the weights report is stale)."""
        done, self._downloaded = self._downloaded, False
        return done

    def get(self, replica_id: str) -> dict[str, Any] | None:
        rep = self._replicas.get(replica_id)
        return rep.to_state() if rep is not None else None

    def wait_for(self, replica_id: str, states: Iterable[str], timeout_s: float,
                 poll_s: float = 0.05) -> dict[str, Any]:
        """Refresh until the replica reaches one of ``states`` or ``timeout_s`` passes;
        returns its last state."""
        wanted = set(states)
        deadline = time.monotonic() + timeout_s
        while True:
            self.refresh()
            state = self.get(replica_id)
            if state is None or state["state"] in wanted or time.monotonic() > deadline:
                return state or {"id": replica_id, "state": STOPPED}
            time.sleep(poll_s)

    # -- stop --------------------------------------------------------------------------
    def _signal_group(self, rep: Replica, sig: int) -> None:
        if rep.pid is None:
            return
        try:
            os.killpg(rep.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            log.warning("no permission to signal engine %s (pid %s)", rep.replica_id, rep.pid)

    def _wait_gone(self, rep: Replica, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._alive(rep):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _terminate(self, rep: Replica) -> None:
        """SIGTERM to the engine's process group, SIGKILL after the grace period."""
        if rep.pid is None or not self._alive(rep):
            return
        self._signal_group(rep, signal.SIGTERM)
        if not self._wait_gone(rep, self.stop_grace_s):
            log.warning("replica %s did not stop within %g s; killing it", rep.replica_id,
                        self.stop_grace_s)
            self._signal_group(rep, signal.SIGKILL)
            self._wait_gone(rep, 5.0)

    def stop(self, replica_id: str) -> bool:
        """Stop a replica and remove its files. False when it is unknown."""
        rep = self._replicas.pop(replica_id, None)
        if rep is None:
            return False
        self.fetches.cancel(replica_id)     # a partial download stays, to be resumed
        self._terminate(rep)
        self._remove_files(replica_id)
        log.info("stopped replica %s (%s)", replica_id, rep.model)
        return True

    def stop_all(self) -> None:
        for rid in list(self._replicas):
            self.stop(rid)

    # -- reconcile ---------------------------------------------------------------------
    def apply(self, assignments: Iterable[Mapping[str, Any]]) -> None:
        """Start every assignment not running here; stop every replica not assigned."""
        wanted: dict[str, Mapping[str, Any]] = {}
        for a in assignments:
            rid = a.get("replica_id") if isinstance(a, Mapping) else None
            if not isinstance(rid, str) or not rid:
                log.warning("ignoring an assignment without replica_id: %r", a)
                continue
            wanted[rid] = a
        for rid in list(self._replicas):
            if rid not in wanted:
                self.stop(rid)
        for rid, assignment in wanted.items():
            if rid not in self._replicas:
                self.start(assignment)

    # -- adopt -------------------------------------------------------------------------
    def read_record(self, path: Path) -> Replica | None:
        """The engine a record of ``run_dir`` describes; an unreadable record is removed
        (with its log) and gives None."""
        now = self.clock()
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            start = data.get("proc_start")
            return Replica(replica_id=str(data["replica_id"]), model=str(data["model"]),
                           engine=str(data.get("engine", "")),
                           host=str(data.get("host", self.host)),
                           port=int(data["port"]) if data.get("port") is not None else None,
                           pid=int(data["pid"]),
                           proc_start=int(start) if start is not None else None,
                           argv=list(data.get("argv", [])),
                           health_path=str(data.get("health_path", "/health")),
                           health=str(data.get("health", "http")),
                           started=float(data.get("started", now)), since=now)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("removing unreadable engine record %s: %s", path, exc)
            self._remove_files(path.stem)
            return None

    @staticmethod
    def recorded_alive(rep: Replica) -> bool:
        """Whether a recorded engine still runs: its pid alive with the recorded start time
        (a guard against pid reuse)."""
        return rep.pid is not None and rep.proc_start is not None \
            and pid_alive(rep.pid, rep.proc_start)

    def adopt(self) -> list[str]:
        """Find engines a previous agent started: a record whose pid is alive with the same
        start time is adopted (health decides starting/ready); other records are removed."""
        adopted: list[str] = []
        for path in sorted(self.run_dir.glob("*.json")):
            rep = self.read_record(path)
            if rep is None or rep.replica_id in self._replicas:
                continue
            if self.recorded_alive(rep):
                self._replicas[rep.replica_id] = rep
                adopted.append(rep.replica_id)
                log.info("adopted replica %s (%s) pid %s port %s", rep.replica_id, rep.model,
                         rep.pid, rep.port)
            else:
                log.info("removing stale record of replica %s (pid %s is gone)",
                         rep.replica_id, rep.pid)
                self._remove_files(rep.replica_id)
        for logfile in self.run_dir.glob("*.log"):
            if logfile.stem not in self._replicas:
                logfile.unlink(missing_ok=True)
        self.refresh()
        return adopted


def stop_recorded_engines(state_dir: str | Path) -> list[str]:
    """Stop every engine recorded under ``state_dir/run`` that is still alive and remove
    the records and logs (``llmgw up`` after its agent exits: the agent leaves its engines
    for the next one). Returns ``replica (model)`` of each engine stopped. It neither adopts
    nor checks health, so nothing it logs reads like a start."""
    sup = Supervisor(Path(state_dir) / "run", {})
    stopped: list[str] = []
    for path in sorted(sup.run_dir.glob("*.json")):
        rep = sup.read_record(path)
        if rep is None:
            continue
        if sup.recorded_alive(rep):
            sup._terminate(rep)
            stopped.append(f"{rep.replica_id} ({rep.model})")
        sup._remove_files(rep.replica_id)
    for logfile in sup.run_dir.glob("*.log"):
        logfile.unlink(missing_ok=True)
    return stopped
