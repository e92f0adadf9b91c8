"""Device sources behind one interface: the CPU, a fake read from a file, and none.

NVML and ``nvidia-smi`` sources plug in later through :data:`SOURCES` (spec prefix ->
factory taking the text after ``:``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

import yaml

from ..errors import DeviceError
from ..fleetvocab import CPU_CLASS
from .model import Device, Discovery, parse_device

log = logging.getLogger(__name__)


class DeviceSource(ABC):
    """Finds the devices of this node. ``discover`` is called every report cycle."""

    name = "abstract"

    @abstractmethod
    def discover(self) -> Discovery:
        """The devices seen now, and the problems that kept any device from use."""


class NullSource(DeviceSource):
    """No devices at all (a node that only reports, or a test)."""

    name = "none"

    def discover(self) -> Discovery:
        return Discovery()


def read_meminfo(path: str | Path = "/proc/meminfo") -> dict[str, int]:
    """``/proc/meminfo`` as ``{key: kB}``."""
    values: dict[str, int] = {}
    with open(path, encoding="ascii") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key.strip()] = int(parts[0])
    return values


class CpuSource(DeviceSource):
    """The CPU as one device (id 0, class ``cpu``), for development and ``make up``."""

    name = "cpu"

    def __init__(self, meminfo: str | Path = "/proc/meminfo", hostname: str | None = None):
        self.meminfo = Path(meminfo)
        self.hostname = hostname or socket.gethostname()

    def discover(self) -> Discovery:
        try:
            info = read_meminfo(self.meminfo)
            total_kb = info["MemTotal"]
            available_kb = info.get("MemAvailable", info.get("MemFree", 0))
        except (OSError, KeyError) as exc:
            return Discovery(problems=[f"cpu: cannot read memory from {self.meminfo}: {exc}"])
        device = Device(
            id=0, uuid=f"cpu-{self.hostname}", card=0, mig=None, klass=CPU_CLASS,
            memory_total_mb=total_kb // 1024,
            memory_used_mb=max(0, total_kb - available_kb) // 1024,
        )
        return Discovery(devices=[device])


class FakeSource(DeviceSource):
    """Devices listed in a JSON or YAML file (tests, ``make up`` without GPUs).

    The file holds ``devices:`` (a list of device objects as in docs/api.md; ``card`` and
    ``id`` default from the position, usage fields from zero/none) and optionally
    ``problems:`` (strings). It is read again on every ``discover``, so a test can change it.
    """

    name = "fake"

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def load(self) -> Discovery:
        """Read and check the file; DeviceError names the file and every bad field."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DeviceError(f"fake devices file {self.path}: cannot read it: "
                              f"{exc.strerror or exc}") from None
        try:
            data: Any = (json.loads(text) if self.path.suffix == ".json"
                         else yaml.safe_load(text))
        except (ValueError, yaml.YAMLError) as exc:
            raise DeviceError(f"fake devices file {self.path}: not valid "
                              f"{'JSON' if self.path.suffix == '.json' else 'YAML'}: {exc}"
                              ) from None
        if isinstance(data, list):
            data = {"devices": data}
        if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
            raise DeviceError(f"fake devices file {self.path}: field 'devices' is missing or "
                              "not a list; write 'devices: [{uuid: ..., class: ..., "
                              "memory_total_mb: ...}]'")
        problems: list[str] = []
        devices: list[Device] = []
        for i, entry in enumerate(data["devices"]):
            device, bad = parse_device(entry, where=f"devices[{i}]", lenient=True, index=i)
            problems.extend(bad)
            if device is not None:
                devices.append(device)
        found = data.get("problems", [])
        if not isinstance(found, list) or not all(isinstance(p, str) for p in found):
            problems.append("problems: must be a list of strings")
        seen: dict[int, int] = {}
        for i, device in enumerate(devices):
            if device.id in seen:
                problems.append(f"devices[{i}].id: {device.id} is used twice")
            seen[device.id] = i
        if problems:
            raise DeviceError(f"fake devices file {self.path} has {len(problems)} "
                              f"problem{'s' if len(problems) > 1 else ''}", details=problems)
        return Discovery(devices=devices, problems=list(found))

    def discover(self) -> Discovery:
        return self.load()


SourceFactory = Callable[[str], DeviceSource]

SOURCES: dict[str, SourceFactory] = {
    "cpu": lambda arg: CpuSource(),
    "none": lambda arg: NullSource(),
    "fake": lambda arg: FakeSource(arg),
    # Imported when built: these modules import DeviceSource from here.
    "nvml": lambda arg: import_module(f"{__package__}.nvml").real_source(),
    "nvidia-smi": lambda arg: import_module(f"{__package__}.nvidia_smi").NvidiaSmiSource(),
    "auto": lambda arg: import_module(f"{__package__}.auto").real_auto_source(),
}


def source_from_spec(spec: str) -> DeviceSource:
    """``auto``, ``nvml``, ``nvidia-smi``, ``cpu``, ``none`` or ``fake:/path/devices.yaml``
    -> a source."""
    kind, sep, arg = spec.strip().partition(":")
    factory = SOURCES.get(kind)
    if factory is None:
        raise DeviceError(f"unknown device source {spec!r}; use one of "
                          + ", ".join(k + (":/path/file.yaml" if k == "fake" else "")
                                      for k in sorted(SOURCES)))
    if kind == "fake":
        if not arg:
            raise DeviceError(f"device source {spec!r} names no file; use fake:/path/file.yaml")
        arg = os.path.expanduser(arg)
    elif sep and arg:
        raise DeviceError(f"device source {kind!r} takes no argument (got {spec!r})")
    return factory(arg)
