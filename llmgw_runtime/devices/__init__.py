"""Devices: whole GPUs, MIG instances or the CPU, found by a :class:`DeviceSource`."""

from .model import Device, Discovery
from .sources import (
    SOURCES,
    CpuSource,
    DeviceSource,
    FakeSource,
    NullSource,
    source_from_spec,
)

__all__ = ["SOURCES", "CpuSource", "Device", "DeviceSource", "Discovery", "FakeSource",
           "NullSource", "source_from_spec"]
