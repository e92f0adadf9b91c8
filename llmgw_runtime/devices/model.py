"""What a device is: a whole GPU, one MIG instance, or the CPU (docs/api.md, "Agent API")."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import DeviceError
from ..fleetvocab import label, placement_id


@dataclass(frozen=True)
class Device:
    """One device as the agent reports it. ``klass`` is the JSON key ``class``."""

    id: int
    uuid: str
    card: int
    klass: str
    memory_total_mb: int
    memory_used_mb: int = 0
    mig: int | None = None
    processes: tuple[dict[str, Any], ...] = ()
    temperature_c: float | None = None
    power_w: float | None = None
    utilization_pct: float | None = None
    healthy: bool = True
    reason: str | None = None
    # MIG only: the GPU instance and compute instance ids, and the profile (``3g.40gb``).
    gpu_instance: int | None = None
    compute_instance: int | None = None
    profile: str | None = None

    @property
    def label(self) -> str:
        """How operators see the id: ``0`` or ``0/mig1``."""
        return label(self.card, self.mig)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "uuid": self.uuid,
            "card": self.card,
            "mig": self.mig,
            "class": self.klass,
            "memory_total_mb": self.memory_total_mb,
            "memory_used_mb": self.memory_used_mb,
            "processes": [dict(p) for p in self.processes],
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "utilization_pct": self.utilization_pct,
            "healthy": self.healthy,
            "reason": self.reason,
            "gpu_instance": self.gpu_instance,
            "compute_instance": self.compute_instance,
            "profile": self.profile,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, where: str = "device") -> Device:
        """Parse the JSON device object strictly; DeviceError names each bad field."""
        device, problems = parse_device(data, where=where, lenient=False)
        if device is None:
            raise DeviceError(f"invalid {where}", details=problems)
        return device


@dataclass(frozen=True)
class Card:
    """One physical GPU as a source saw it, whether or not it yields devices.

    ``problem`` is set when the card can run nothing (MIG enabled with nothing carved, a
    MIG change pending, an NVML error); ``hint`` says what the operator can do about it."""

    index: int
    uuid: str | None
    name: str
    klass: str | None
    mig_current: bool | None = None      # None: the card has no MIG support
    mig_pending: bool | None = None
    instances: int = 0                   # MIG devices carved
    problem: str | None = None
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Discovery:
    """What a device source found: the devices, the cards they come from, and what could
    not be used and why (``problems``: one line each, naming the card and what to do)."""

    devices: list[Device] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    cards: list[Card] = field(default_factory=list)
    source: str = ""
    driver_version: str | None = None

    def to_dicts(self) -> list[dict[str, Any]]:
        return [d.to_dict() for d in self.devices]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def parse_device(data: Any, *, where: str, lenient: bool,
                 index: int = 0) -> tuple[Device | None, list[str]]:
    """Parse one device object. ``lenient`` (fake files) fills defaults for everything but
    ``uuid``, ``class`` and ``memory_total_mb``. Returns the device (or None) and problems."""
    if not isinstance(data, Mapping):
        return None, [f"{where}: must be a mapping, got {type(data).__name__}"]
    problems: list[str] = []

    def get(key: str, check: Any, what: str, default: Any = dataclasses.MISSING,
            optional: bool = False) -> Any:
        if key not in data:
            if default is not dataclasses.MISSING and (lenient or optional):
                return default
            problems.append(f"{where}.{key}: missing; it must be {what}")
            return None
        value = data[key]
        if value is None and optional:
            return None
        if not check(value):
            problems.append(f"{where}.{key}: {value!r} is not {what}")
            return None
        return value

    def non_empty_str(v: Any) -> bool:
        return isinstance(v, str) and bool(v.strip())

    uuid = get("uuid", non_empty_str, "a non-empty string")
    klass = get("class", non_empty_str, "a non-empty string (e.g. a100-80g or cpu)")
    card = get("card", lambda v: _is_int(v) and v >= 0, "an integer >= 0", default=index)
    mig = get("mig", lambda v: _is_int(v) and v >= 0, "null or an integer >= 0",
              default=None, optional=True)
    default_id = placement_id(card, mig) if isinstance(card, int) else 0
    dev_id = get("id", lambda v: _is_int(v) and v >= 0, "an integer >= 0", default=default_id)
    total = get("memory_total_mb", lambda v: _is_int(v) and v >= 0, "an integer >= 0 (MB)")
    used = get("memory_used_mb", lambda v: _is_int(v) and v >= 0, "an integer >= 0 (MB)",
               default=0)
    processes = get("processes", lambda v: isinstance(v, list)
                    and all(isinstance(p, Mapping) for p in v),
                    "a list of objects", default=[])
    extras = {}
    for key in ("temperature_c", "power_w", "utilization_pct"):
        extras[key] = get(key, _is_number, "null or a number", default=None, optional=True)
    for key in ("gpu_instance", "compute_instance"):
        extras[key] = get(key, lambda v: _is_int(v) and v >= 0, "null or an integer >= 0",
                          default=None, optional=True)
    extras["profile"] = get("profile", lambda v: isinstance(v, str), "null or a string",
                            default=None, optional=True)
    healthy = get("healthy", lambda v: isinstance(v, bool), "true or false", default=True)
    reason = get("reason", lambda v: isinstance(v, str), "null or a string", default=None,
                 optional=True)
    if problems:
        return None, problems
    device = Device(
        id=dev_id, uuid=uuid, card=card, mig=mig, klass=klass,
        memory_total_mb=total, memory_used_mb=used,
        processes=tuple(dict(p) for p in processes or []),
        temperature_c=extras["temperature_c"], power_w=extras["power_w"],
        utilization_pct=extras["utilization_pct"], healthy=healthy, reason=reason,
        gpu_instance=extras["gpu_instance"], compute_instance=extras["compute_instance"],
        profile=extras["profile"],
    )
    return device, []
