"""The agent loop: discover devices, report, apply the assignments; again and again."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from .. import __version__
from ..devices import DeviceSource, Discovery, source_from_spec
from ..engines import drivers_from_config
from ..errors import LlmgwError
from .client import ControlClient
from .config import AgentConfig
from .supervisor import Supervisor

log = logging.getLogger(__name__)

MAX_SEEN = 500


def weights_seen(dirs: Sequence[str | Path]) -> list[str]:
    """What each weights directory holds at its top level: model files (``.gguf``,
    ``.safetensors``) and non-empty sub-directories. An empty directory is not weights."""
    seen: list[str] = []
    for d in dirs:
        base = Path(d).expanduser()
        try:
            entries = sorted(base.iterdir())
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_file() and entry.suffix in (".gguf", ".safetensors", ".bin"):
                    seen.append(str(entry))
                elif entry.is_dir() and any(entry.iterdir()):
                    seen.append(str(entry))
            except OSError:
                continue
            if len(seen) >= MAX_SEEN:
                return seen
    return seen


class Agent:
    """One node's agent. ``run_cycle`` does one report round; the parts are passed in."""

    def __init__(self, config: AgentConfig, *, source: DeviceSource, supervisor: Supervisor,
                 client: ControlClient, engines: Sequence[str]):
        self.config = config
        self.source = source
        self.supervisor = supervisor
        self.client = client
        self.engines = list(engines)
        self.interval_s = config.report_interval_s
        self._last_problem: str | None = None

    @classmethod
    def from_config(cls, config: AgentConfig) -> Agent:
        drivers = drivers_from_config(config.llama_server_binary, config.vllm_python)
        supervisor = Supervisor(config.run_dir, drivers, host=config.engine_host,
                                weights_dirs=config.weights_dirs,
                                start_timeout_s=config.start_timeout_s)
        client = ControlClient(config.control_url, config.join_token, config.node_name,
                               config.credential_path, ca_certs=config.ca_file or None)
        return cls(config, source=source_from_spec(config.devices), supervisor=supervisor,
                   client=client, engines=sorted(drivers))

    def build_report(self) -> dict[str, Any]:
        try:
            discovery = self.source.discover()
        except LlmgwError as exc:
            discovery = Discovery(problems=[str(exc)])
        devices = discovery.to_dicts()
        problems = list(discovery.problems)
        self._note_problems(problems)
        return {
            "node": self.config.node_name,
            "address": self.config.address,
            "agent_version": __version__,
            "fabric": self.config.fabric,
            "devices": devices,
            "device_problems": problems,
            "device_source": discovery.source or self.source.name,
            "driver_version": discovery.driver_version,
            "cards": [card.to_dict() for card in discovery.cards],
            "engines": self.engines,
            "weights": {"dirs": list(self.config.weights_dirs),
                        "seen": weights_seen(self.config.weights_dirs)},
            "replicas": self.supervisor.states(),
        }

    def _note_problems(self, problems: list[str]) -> None:
        text = "; ".join(problems) or None
        if text != self._last_problem:
            if text:
                log.warning("device problems: %s", text)
            else:
                log.info("device problems cleared")
            self._last_problem = text

    def run_cycle(self) -> float:
        """Report and apply the answer. Never raises for a failed cycle: logs it (with a
        traceback when unexpected) and returns the seconds to wait before the next one."""
        try:
            answer = self.client.report(self.build_report())
            assignments = answer.get("assignments", [])
            if not isinstance(assignments, list):
                raise LlmgwError("report answer: 'assignments' is not a list")
            self.supervisor.apply(assignments)
            interval = answer.get("report_interval_s")
            if isinstance(interval, (int, float)) and interval > 0:
                self.interval_s = float(interval)
        except LlmgwError as exc:
            log.warning("agent cycle failed: %s", exc)
        except Exception:
            log.exception("agent cycle failed unexpectedly; continuing")
        return self.interval_s


def run(config: AgentConfig, stop: threading.Event | None = None) -> int:
    """Run the agent until SIGTERM/SIGINT (or ``stop`` is set). Adopts engines a previous
    agent left running first; stops engines on exit only when ``stop_engines_on_exit``."""
    stop = stop or threading.Event()
    agent = Agent.from_config(config)
    adopted = agent.supervisor.adopt()
    log.info("agent %s reporting to %s; engines %s; adopted %d running replica(s)",
             config.node_name, config.control_url, ", ".join(agent.engines), len(adopted))

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received signal %d; stopping the agent", signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    try:
        while not stop.is_set():
            interval = agent.run_cycle()
            stop.wait(interval)
    finally:
        if config.stop_engines_on_exit:
            log.info("stopping every engine (stop_engines_on_exit)")
            agent.supervisor.stop_all()
        else:
            log.info("leaving engines running; the next agent adopts them")
    return 0
