"""Agent <-> control: the join, the report and its answer (the node's assignments)."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from pydantic import Field, model_validator

from ..catalog.bounds import MAX_SLOTS_PER_REPLICA
from .fields import (
    MAX_DEVICES,
    MAX_LIST,
    Answer,
    Bool,
    Count,
    Finite,
    Id,
    Line,
    Message,
    Name,
    NodeName,
    NonNegative,
    Pid,
    Port,
    SmallCount,
    Text,
    Token,
)
from .states import ReportedState

MAX_SOURCES = 2000        # catalog sources an agent looks for (one per model at most)
MAX_ENGINES = 16


class JoinRequest(Message):
    """A node asks for its credential with the join token. Joining under a name that
    already has a credential needs that credential (``credential``) or an admin reset."""

    node: NodeName
    credential: Token | None = None


class JoinAnswer(Answer):
    node: NodeName
    credential: Token


class Process(Message):
    pid: Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]
    name: Line | None = None
    used_memory_mb: Count | None = None
    type: Line | None = None


class DeviceReport(Message):
    """One device: a whole GPU, a MIG instance or the CPU (DESIGN.md "Devices")."""

    id: SmallCount
    uuid: Line
    card: SmallCount = 0
    mig: SmallCount | None = None
    klass: Line = Field(alias="class", min_length=1)
    memory_total_mb: Count
    memory_used_mb: Count = 0
    processes: list[Process] = Field(default_factory=list, max_length=256)
    temperature_c: Finite | None = None
    power_w: Finite | None = None
    utilization_pct: Annotated[float, Field(allow_inf_nan=False, ge=0, le=100)] | None = None
    healthy: Bool = True
    reason: Text | None = None
    gpu_instance: SmallCount | None = None
    compute_instance: SmallCount | None = None
    profile: Line | None = None


class CardReport(Message):
    index: SmallCount
    uuid: Line | None = None
    name: Line
    klass: Line | None = None
    mig_current: Bool | None = None
    mig_pending: Bool | None = None
    instances: SmallCount = 0
    problem: Text | None = None
    hint: Text | None = None


class Progress(Message):
    bytes: Count
    total: Count | None = None
    rate_bps: NonNegative = 0.0


class ReplicaReport(Message):
    """What the agent says of one replica or worker part it runs."""

    id: Id
    model: Name | None = None
    state: Annotated[ReportedState, Field(strict=False)]
    port: Port | None = None
    pid: Pid | None = None
    last_error: Text | None = None
    progress: Progress | None = None


class WeightsDir(Message):
    path: Line
    fstype: Line
    shared: Bool
    exists: Bool


class WeightsSeen(Message):
    path: Line
    shared: Bool


class Weights(Message):
    """Where the agent looked for weights and which catalog sources it found."""

    dirs: list[WeightsDir] = Field(default_factory=list, max_length=64)
    sources: dict[Annotated[str, Field(max_length=2048)], WeightsSeen] = Field(
        default_factory=dict, max_length=MAX_SOURCES)


def twice(what: str, items: list[DeviceReport] | list[ReplicaReport] | None) -> str | None:
    """``"replicas: id 'r1' appears twice"`` for the first id of ``items`` that repeats
    (a report's and a heartbeat's devices and replicas each name an id once), or None."""
    seen: set[object] = set()
    for item in items or ():
        if item.id in seen:
            return f"{what}: id {item.id!r} appears twice"
        seen.add(item.id)
    return None


class Report(Message):
    """A node's report, every few seconds; answered with :class:`ReportAnswer`."""

    node: NodeName
    address: Line | None = None
    agent_version: Annotated[Line, Field(max_length=40)] | None = None
    fabric: Annotated[Line, Field(min_length=1, max_length=200)] | None = None
    devices: list[DeviceReport] = Field(default_factory=list, max_length=MAX_DEVICES)
    device_problems: list[Text] = Field(default_factory=list, max_length=256)
    device_source: Line | None = None
    driver_version: Line | None = None
    cards: list[CardReport] = Field(default_factory=list, max_length=256)
    engines: list[Line] = Field(default_factory=list, max_length=MAX_ENGINES)
    replicas: list[ReplicaReport] = Field(default_factory=list, max_length=MAX_LIST)
    weights: Weights = Field(default_factory=Weights)
    sources_hash: Annotated[str, Field(max_length=64)] | None = None
    # The agent's last report: it is exiting and has stopped its engines, so the node is
    # not capacity from now on (not when it goes silent, node_timeout_s later).
    stopping: Bool = False

    @model_validator(mode="after")
    def _unique(self) -> Report:
        for what, items in (("devices", self.devices), ("replicas", self.replicas)):
            problem = twice(what, items)
            if problem is not None:
                raise ValueError(problem)
        return self


class Peer(Answer):
    rank: SmallCount
    node: NodeName
    address: Line | None = None


class AssignedProfile(Answer):
    gpus: SmallCount
    tp: SmallCount
    pp: SmallCount
    nodes: SmallCount


class Assignment(Answer):
    """One replica (or worker part of a multi-node replica) this node should run."""

    replica_id: Id
    model: Name
    engine: Line
    source: Annotated[str, Field(max_length=4096)]
    sha256: Line | None = None
    size_bytes: Count | None = None
    args: list[Annotated[str, Field(max_length=4096)]] = Field(max_length=MAX_LIST)
    profile: AssignedProfile
    devices: list[SmallCount] = Field(max_length=MAX_DEVICES)
    device_uuids: list[Line | None] = Field(max_length=MAX_DEVICES)
    device_kind: Literal["cpu", "gpu", "mig"]
    role: Literal["head", "worker"] | None = None
    rank: SmallCount | None = None
    nodes: SmallCount | None = None
    rendezvous_port: Port | None = None
    head_address: Line | None = None
    peers: list[Peer] | None = Field(default=None, max_length=MAX_LIST)
    replica: Id | None = None
    # The catalog's slots (requests served at once); the driver adds the engine's flag
    # (llama.cpp --parallel, vLLM --max-num-seqs) unless the args set it. None: not set.
    slots: Annotated[int, Field(strict=True, ge=1, le=MAX_SLOTS_PER_REPLICA)] | None = None


class ReportAnswer(Answer):
    assignments: list[Assignment] = Field(max_length=MAX_LIST)
    report_interval_s: Annotated[float, Field(allow_inf_nan=False, gt=0, le=3600)]
    sources: list[Annotated[str, Field(max_length=4096)]] | None = Field(
        default=None, max_length=MAX_SOURCES)
    sources_hash: Annotated[str, Field(max_length=64)] | None = None
    problems: list[Text] = Field(default_factory=list, max_length=64)


# ---------------------------------------------------------------- the heartbeat (issue 30)

Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
FULL_REPORT_EVERY_S = 300.0   # an agent sends a full report at least this often, changed or not


class Heartbeat(Message):
    """What an agent sends in place of a report when nothing but its replicas' states or
    its devices' readings changed since its last full report (``POST
    /api/v1/agent/heartbeat``).

    ``digest`` is :func:`report_digest` of the last full report this agent sent. The
    control service answers from memory when it holds that report: it takes the report,
    puts ``replicas`` (sent only when a replica's state, port, pid, error or progress
    changed since the last heartbeat or report) and ``devices`` (sent only when a reading
    changed) in place of the report's, and answers as it would answer that report. When it
    does not hold the report (another control host, a restart, a changed node) its answer
    has ``full_report`` true and the agent sends its full report at once."""

    node: NodeName
    digest: Digest
    replicas: list[ReplicaReport] | None = Field(default=None, max_length=MAX_LIST)
    devices: list[DeviceReport] | None = Field(default=None, max_length=MAX_DEVICES)


class HeartbeatAnswer(Answer):
    """``full_report`` true: send the full report now (``answer`` is then None and the
    agent changes nothing it runs). Else ``answer`` is what the report would have got."""

    full_report: Bool = False
    answer: ReportAnswer | None = None


def report_digest(body: bytes) -> str:
    """The digest a heartbeat names: sha256 of the full report's JSON body as sent."""
    return hashlib.sha256(body).hexdigest()
