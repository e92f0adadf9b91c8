"""``nvidia-smi -q -x``: the XML log parsed into plain records, nothing decided yet.

Schema versions 11, 12 and 13 (``nvsmi_device_v1N.dtd``) differ in where they keep power
(``power_readings/power_draw``, ``gpu_power_readings/power_draw``, v13's
``gpu_power_readings/average_power_draw`` and ``instant_power_draw``) and in the name of the
clock reasons (``clocks_throttle_reasons`` before 535, ``clocks_event_reasons`` after). A
value nvidia-smi could not read ("N/A", "[N/A]", "Not Supported", "Unknown Error", ...) is
absent (``None``), never zero. Whitespace and newlines inside values are ignored.
"""

from __future__ import annotations

import logging
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from ..errors import DeviceError
from .health import HealthFacts

log = logging.getLogger(__name__)

# What nvidia-smi prints where it has no value (compared lower case, brackets removed).
ABSENT = frozenset({
    "", "n/a", "na", "not supported", "unknown error", "unknown", "not available",
    "insufficient permissions", "requested functionality has been deprecated",
    "gpu requires reset", "gpu is lost", "not found", "none",
})
_NUMBER = re.compile(r"^([-+]?\d+(?:\.\d+)?)(?:\s*[A-Za-z%]+)?$")
_SCHEMA = re.compile(r"nvsmi_device_v(\d+)\.dtd")
_REASON_PREFIXES = ("clocks_event_reason_", "clocks_throttle_reason_")


class NvidiaSmiError(DeviceError):
    """nvidia-smi could not be run, or what it printed cannot be read."""


@dataclass(frozen=True)
class XmlProcess:
    pid: int
    name: str
    type: str | None
    used_memory_mb: int | None
    gpu_instance: int | None       # set on a MIG card: the GPU instance it runs in
    compute_instance: int | None

    def to_dict(self) -> dict[str, Any]:
        """The device's process entry: pid, name, used_memory_mb, type."""
        return {"pid": self.pid, "name": self.name, "used_memory_mb": self.used_memory_mb,
                "type": self.type}


@dataclass(frozen=True)
class XmlMigDevice:
    """One ``<mig_device>``. It has no UUID and no profile: only ``nvidia-smi -L`` names
    those. ``index`` is the enumeration index (``Device N`` of -L), not a GPU instance id."""

    index: int
    gpu_instance: int | None
    compute_instance: int | None
    memory_total_mb: int | None
    memory_used_mb: int | None
    multiprocessors: int | None


@dataclass(frozen=True)
class XmlGpu:
    """One ``<gpu>``; ``position`` is its place in the log (the card index)."""

    position: int
    pci_bus_id: str | None
    product_name: str
    uuid: str | None
    mig_current: bool | None           # None: MIG not supported ("N/A")
    mig_pending: bool | None
    mig_devices: tuple[XmlMigDevice, ...]
    memory_total_mb: int | None
    memory_used_mb: int | None
    memory_free_mb: int | None
    temperature_c: float | None
    power_w: float | None
    utilization_pct: float | None
    processes: tuple[XmlProcess, ...]
    health: HealthFacts
    clock_reasons_active: tuple[str, ...]   # e.g. ("gpu_idle",), from either element name


@dataclass(frozen=True)
class XmlLog:
    driver_version: str | None
    cuda_version: str | None
    schema_version: int | None         # from the DOCTYPE; None when there is none
    attached_gpus: int | None
    gpus: tuple[XmlGpu, ...]


def value(elem: ET.Element | None, path: str) -> str | None:
    """The text at ``path`` with whitespace collapsed; None when missing or absent."""
    if elem is None:
        return None
    found = elem.find(path)
    if found is None or found.text is None:
        return None
    text = " ".join(found.text.split())
    bare = text[1:-1].strip() if text.startswith("[") and text.endswith("]") else text
    if bare.lower() in ABSENT:
        return None
    return text


def number(elem: ET.Element | None, path: str) -> float | None:
    """``36 C``, ``66.92 W``, ``65 %`` -> the number; None when absent or not a number."""
    text = value(elem, path)
    if text is None:
        return None
    match = _NUMBER.match(text)
    if match is None:
        log.debug("nvidia-smi: %s=%r is not a number; treated as absent", path, text)
        return None
    return float(match.group(1))


def integer(elem: ET.Element | None, path: str) -> int | None:
    """``81920 MiB`` or ``3`` -> an int; None when absent."""
    found = number(elem, path)
    return None if found is None else int(found)


def yes_no(elem: ET.Element | None, path: str) -> bool | None:
    text = value(elem, path)
    if text is None:
        return None
    return {"yes": True, "no": False}.get(text.lower())


def enabled(elem: ET.Element | None, path: str) -> bool | None:
    text = value(elem, path)
    if text is None:
        return None
    return {"enabled": True, "disabled": False}.get(text.lower())


def any_true(*flags: bool | None) -> bool | None:
    """True if one is True; False if one is False and none True; None if none is known."""
    known = [f for f in flags if f is not None]
    return any(known) if known else None


def _power(gpu: ET.Element) -> float | None:
    for path in ("gpu_power_readings/power_draw", "power_readings/power_draw",
                 "gpu_power_readings/average_power_draw",
                 "gpu_power_readings/instant_power_draw"):
        found = number(gpu, path)
        if found is not None:
            return found
    return None


def _volatile_uncorrectable(gpu: ET.Element) -> int | None:
    """Sum of the volatile uncorrectable ECC counters: ``sram_uncorrectable``,
    ``dram_uncorrectable``, v13's ``sram_uncorrectable_parity``/``_secded`` and the old
    ``double_bit/total``. None when none of them is reported."""
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None
    counts = [integer(volatile, child.tag) for child in volatile
              if "uncorrectable" in child.tag]
    counts.append(integer(volatile, "double_bit/total"))
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


def _health(gpu: ET.Element) -> HealthFacts:
    return HealthFacts(
        retired_pages_pending=any_true(yes_no(gpu, "retired_pages/pending_retirement"),
                                       yes_no(gpu, "retired_pages/pending_blacklist")),
        remap_failure=any_true(yes_no(gpu, "remapped_rows/remapped_row_failure"),
                               yes_no(gpu, "remapped_rows/remapping_failure_occurred")),
        remap_pending=yes_no(gpu, "remapped_rows/remapped_row_pending"),
        uncorrectable_ecc_volatile=_volatile_uncorrectable(gpu),
    )


def _clock_reasons(gpu: ET.Element) -> tuple[str, ...]:
    found = gpu.find("clocks_event_reasons")
    if found is None:
        found = gpu.find("clocks_throttle_reasons")
    if found is None:
        return ()
    active = []
    for child in found:
        if (value(found, child.tag) or "").lower() != "active":
            continue
        name = child.tag
        for prefix in _REASON_PREFIXES:
            name = name.removeprefix(prefix)
        active.append(name)
    return tuple(active)


def _process(elem: ET.Element) -> XmlProcess | None:
    pid = integer(elem, "pid")
    if pid is None:
        return None
    name_elem = elem.find("process_name")
    name = " ".join((name_elem.text or "").split()) if name_elem is not None else ""
    return XmlProcess(pid=pid, name=name, type=value(elem, "type"),
                      used_memory_mb=integer(elem, "used_memory"),
                      gpu_instance=integer(elem, "gpu_instance_id"),
                      compute_instance=integer(elem, "compute_instance_id"))


def _mig_device(elem: ET.Element, position: int) -> XmlMigDevice:
    index = integer(elem, "index")
    return XmlMigDevice(
        index=position if index is None else index,
        gpu_instance=integer(elem, "gpu_instance_id"),
        compute_instance=integer(elem, "compute_instance_id"),
        memory_total_mb=integer(elem, "fb_memory_usage/total"),
        memory_used_mb=integer(elem, "fb_memory_usage/used"),
        multiprocessors=integer(elem, "device_attributes/shared/multiprocessor_count"),
    )


def _gpu(elem: ET.Element, position: int) -> XmlGpu:
    processes = [_process(p) for p in elem.findall("processes/process_info")]
    return XmlGpu(
        position=position,
        pci_bus_id=elem.get("id") or value(elem, "pci/pci_bus_id"),
        product_name=value(elem, "product_name") or "unknown GPU",
        uuid=value(elem, "uuid"),
        mig_current=enabled(elem, "mig_mode/current_mig"),
        mig_pending=enabled(elem, "mig_mode/pending_mig"),
        mig_devices=tuple(_mig_device(m, i)
                          for i, m in enumerate(elem.findall("mig_devices/mig_device"))),
        memory_total_mb=integer(elem, "fb_memory_usage/total"),
        memory_used_mb=integer(elem, "fb_memory_usage/used"),
        memory_free_mb=integer(elem, "fb_memory_usage/free"),
        temperature_c=number(elem, "temperature/gpu_temp"),
        power_w=_power(elem),
        utilization_pct=number(elem, "utilization/gpu_util"),
        processes=tuple(p for p in processes if p is not None),
        health=_health(elem),
        clock_reasons_active=_clock_reasons(elem),
    )


def parse_xml(text: str) -> XmlLog:
    """Parse ``nvidia-smi -q -x``; NvidiaSmiError when it is not an nvidia_smi_log."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise NvidiaSmiError(f"`nvidia-smi -q -x` printed something that is not XML ({exc}); "
                             "run it by hand to see what it says") from None
    if root.tag != "nvidia_smi_log":
        raise NvidiaSmiError(f"`nvidia-smi -q -x` printed <{root.tag}>, not <nvidia_smi_log>")
    schema = _SCHEMA.search(text[:500])
    return XmlLog(
        driver_version=value(root, "driver_version"),
        cuda_version=value(root, "cuda_version"),
        schema_version=int(schema.group(1)) if schema else None,
        attached_gpus=integer(root, "attached_gpus"),
        gpus=tuple(_gpu(g, i) for i, g in enumerate(root.findall("gpu"))),
    )
