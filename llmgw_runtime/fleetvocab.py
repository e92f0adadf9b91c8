"""The fleet's vocabulary: the words and one-line rules that placement, the devices, the
weights report, the engines, the reconciler and every status view share, written once.

Pure and low: no I/O, no clock (``now`` comes in), and it imports only the states, so the
status summary can speak of the fleet without importing the planner, the hardware
sources or the disk scanner.
"""

from __future__ import annotations

from typing import Any

from .api.states import LIVE_REPLICA_STATES, ReplicaState

# The device class of a node's CPU (devices/sources.py CpuSource): on it llama.cpp is the
# CPU engine, and every replica shares the device.
CPU_CLASS = "cpu"
# Replica states that hold their devices: placed and not yet stopped or failed.
ACTIVE = (ReplicaState.PENDING, *LIVE_REPLICA_STATES)
# A shared device (the CPU, or a GPU whose replicas declare memory_gb) runs at most this many
# replicas, whatever their memory: each is an engine process with its own threads, and a CPU
# replica that declares no memory_gb is bounded by this alone. A replica with memory_gb also
# needs that much free on the device (reported free memory, less what replicas not yet ready
# there will take), on the CPU as on a GPU.
MAX_REPLICAS_PER_SHARED_DEVICE = 16
# Placement ids of MIG instances start here: 1000 + 100 x card + instance.
MIG_ID_BASE = 1000
# With prefix affinity a request waits for its home replica (the one holding its prompt's
# prefix, or the one it was placed on) while another has a free slot, at most this share
# of its model's max_wait_s; then any free slot will do (router/admission/core.py, and
# what the status summary says of requests waiting beside free slots).
HOME_WAIT_SHARE = 0.5


def home_wait_s(max_wait_s: float) -> float:
    """The longest a request waits for its home replica while a slot is free elsewhere."""
    return max_wait_s * HOME_WAIT_SHARE


def heard_from(last_report: float | None, now: float, node_timeout_s: float) -> bool:
    """The one rule of node liveness: it reported within ``node_timeout_s`` of ``now``
    (the store's clock). Placement, the reconciler, the status summary, the console,
    /metrics and node deletion all ask this."""
    return last_report is not None and now - last_report <= node_timeout_s


def shares_device(klass: str, memory_gb: float | None) -> bool:
    """A replica of this profile shares its device with others instead of taking it whole:
    on the CPU class always, on any other class when it declares memory_gb. The one rule
    placement and every view of capacity (status/summary.py) use."""
    return memory_gb is not None or klass == CPU_CLASS


def label(card: int, mig: int | None) -> str:
    """How operators see a device: ``0`` for a whole GPU, ``0/mig1`` for a MIG instance."""
    return str(card) if mig is None else f"{card}/mig{mig}"


def placement_id(card: int, mig: int | None) -> int:
    """Card index for a whole GPU; ``1000 + 100 x card + instance`` for a MIG instance."""
    if mig is None:
        return card
    return MIG_ID_BASE + 100 * card + mig


def label_of_id(device_id: int) -> str:
    """The operator's label of a placement id: ``1002`` is ``0/mig2``, ``3`` is ``3``."""
    if device_id < MIG_ID_BASE:
        return str(device_id)
    card, mig = divmod(device_id - MIG_ID_BASE, 100)
    return label(card, mig)


def held_sources(report: Any) -> tuple[frozenset[str], frozenset[str]]:
    """(sources held on local storage, sources on a shared filer) from an agent's weights
    report (weights/scan.py writes it: ``{"sources": {source: {"shared": bool}}}``)."""
    sources = report.get("sources") if isinstance(report, dict) else None
    if not isinstance(sources, dict):
        return frozenset(), frozenset()
    shared = frozenset(s for s, seen in sources.items()
                       if isinstance(seen, dict) and seen.get("shared"))
    return frozenset(sources) - shared, shared
