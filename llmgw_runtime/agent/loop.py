"""The agent loop: discover devices, report, apply the assignments; again and again.

A cycle sends the full report when it is the first, when anything but the replicas' states
and the devices' readings changed since the last full report, when the control service
asks for it (``full_report``), and at least every ``FULL_REPORT_EVERY_S``; otherwise a
heartbeat (api/agent.py ``Heartbeat``) naming that report's digest, with the replicas and
the devices when they differ from that report's. Once a heartbeat carried them, every
heartbeat carries them until the next full report, so whichever control process answers,
a heartbeat without them means "as in the full report". A control service without the
heartbeat endpoint (an older version) gets full reports only."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

from .. import __version__
from ..api.agent import FULL_REPORT_EVERY_S, DeviceReport, Heartbeat, Report, ReportAnswer
from ..api.fields import clean
from ..api.parse import parse
from ..devices import DeviceSource, Discovery, source_from_spec
from ..engines import drivers_from_config
from ..errors import AuthError, LlmgwError
from ..weights.scan import Scanner
from .client import ControlClient, HeartbeatRefused, NoHeartbeats
from .config import AgentConfig
from .supervisor import Supervisor

log = logging.getLogger(__name__)

# What a device's heartbeat may change; a change of anything else of it is a full report.
READINGS = {"memory_used_mb", "processes", "temperature_c", "power_w", "utilization_pct",
            "healthy", "reason"}
CHANGING = ("replicas", "devices")      # what a heartbeat carries


def _identity(devices: list[DeviceReport]) -> list[dict[str, Any]]:
    return [d.model_dump(exclude=READINGS) for d in devices]


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
        self._last_answer_problem: str | None = None
        # The catalog's sources, sent by the control service when they change; looked for
        # in the weights directories (only when the agent has some).
        self.sources: list[str] = []
        self.sources_hash = ""
        self.scanner = Scanner(config.weights_dirs, interval_s=config.weights_scan_interval_s)
        self.heartbeats = True              # False: the control service has none (older)
        self._sent: Report | None = None    # the last full report answered
        self._sent_at = 0.0                 # when (time.monotonic)
        self._carried: set[str] = set()     # of CHANGING: in a heartbeat since it

    @classmethod
    def from_config(cls, config: AgentConfig) -> Agent:
        drivers = drivers_from_config(config.llama_server_binary, config.vllm_python,
                                      config.llama_rpc_binary)
        supervisor = Supervisor(config.run_dir, drivers, host=config.engine_host,
                                weights_dirs=config.weights_dirs,
                                start_timeout_s=config.start_timeout_s,
                                fetch_dir=config.fetch_dir, hf_token=config.hf_token or None)
        client = ControlClient(config.control_url, config.join_token, config.node_name,
                               config.credential_path, ca_certs=config.ca_file or None)
        return cls(config, source=source_from_spec(config.devices), supervisor=supervisor,
                   client=client, engines=sorted(drivers))

    def build_report(self) -> Report:
        """This node's report, checked by the same parser as the control service uses
        (text from engines and drivers made printable and bounded first)."""
        return parse(Report, clean(self.report_dict()), what="report this agent built")

    def report_dict(self) -> dict[str, Any]:
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
            "replicas": self.supervisor.states(),
            **self._weights(),
        }

    def _weights(self) -> dict[str, Any]:
        """The weights part of the report: nothing when told no directories."""
        if not self.config.weights_dirs:
            return {"weights": {}}
        if self.supervisor.downloads_finished():
            self.scanner.invalidate()       # a download just completed: look again now
        return {"weights": self.scanner.scan(self.sources), "sources_hash": self.sources_hash}

    def _note_answer_problems(self, problems: list[str]) -> None:
        text = "; ".join(problems) or None
        if text != self._last_answer_problem:
            if text:
                log.warning("the control service did not use all of this report: %s", text)
            self._last_answer_problem = text

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
            answer = self._exchange(self.build_report())
            self.supervisor.apply([a.model_dump(mode="json", exclude_unset=True)
                                   for a in answer.assignments])
            if answer.sources is not None:
                self.sources = list(answer.sources)
                self.sources_hash = answer.sources_hash or ""
            self.interval_s = answer.report_interval_s
            self._note_answer_problems(answer.problems)
        except LlmgwError as exc:
            log.warning("agent cycle failed: %s", exc)
        except Exception:
            log.exception("agent cycle failed unexpectedly; continuing")
        return self.interval_s

    def _exchange(self, report: Report) -> ReportAnswer:
        """Send ``report`` as a heartbeat when it may be one, else (or when the control
        service asks for it) in full; returns the answer."""
        beat = self.heartbeat_of(report)
        if beat is not None:
            try:
                got = self.client.heartbeat(beat)
            except NoHeartbeats:
                log.info("the control service at %s takes no heartbeats (an older version); "
                         "sending full reports", self.client.base)
                self.heartbeats = False
            except (AuthError, HeartbeatRefused) as exc:
                log.info("heartbeat not taken (%s); sending the full report", exc)
            else:
                if not got.full_report and got.answer is not None:
                    self._carried.update(k for k in CHANGING if getattr(beat, k) is not None)
                    return got.answer
        self._sent = None                   # until this one is answered
        answer = self.client.report(report)
        self._sent, self._sent_at, self._carried = report, time.monotonic(), set()
        return answer

    def heartbeat_of(self, report: Report) -> Heartbeat | None:
        """The heartbeat that says ``report``, or None when it must be sent in full."""
        sent, digest = self._sent, self.client.digest
        if not self.heartbeats or sent is None or digest is None or report.stopping \
                or time.monotonic() - self._sent_at >= FULL_REPORT_EVERY_S:
            return None
        if _identity(report.devices) != _identity(sent.devices) or \
                report.model_dump(exclude=set(CHANGING)) != sent.model_dump(exclude=set(CHANGING)):
            return None
        carried = {k: getattr(report, k) for k in CHANGING
                   if k in self._carried or getattr(report, k) != getattr(sent, k)}
        return Heartbeat(node=report.node, digest=digest, **carried)

    def stop_engines(self, why: str) -> None:
        """Stop every engine of this node, then say so in a last report, so that the
        control service stops routing to them now instead of when the node goes silent.
        A report that cannot be sent is logged; it never keeps the agent from exiting."""
        running = self.supervisor.states()
        self.supervisor.stop_all()
        message = f"the agent on {self.config.node_name} stopped this replica: {why}"
        stopped = [{"id": r["id"], "model": r.get("model"), "state": "stopped",
                    "port": None, "pid": None,
                    "last_error": r.get("last_error") if r["state"] == "failed" else message}
                   for r in running]
        try:
            report = parse(Report, clean({**self.report_dict(), "replicas": stopped,
                                          "stopping": True}),
                           what="last report of this agent")
            self.client.report(report)
            log.info("reported %d replica(s) stopped", len(stopped))
        except LlmgwError as exc:
            log.warning("could not report the stopped replicas (%s); the control service "
                        "notices when this node goes silent", exc)
        except Exception:
            log.exception("could not report the stopped replicas")


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
            agent.stop_engines("the agent is shutting down and stops its engines on exit "
                               "(stop_engines_on_exit)")
        else:
            log.info("leaving engines running; the next agent adopts them")
    return 0
