"""``--devices auto``: NVML first; when NVML cannot be used at all, ``nvidia-smi``."""

from __future__ import annotations

from .model import Discovery
from .sources import DeviceSource


def saw_nothing(found: Discovery) -> bool:
    """The source could not look at any card (no driver, no library, no binary)."""
    return not found.cards and not found.devices


class AutoSource(DeviceSource):
    name = "auto"

    def __init__(self, primary: DeviceSource, fallback: DeviceSource) -> None:
        self.primary = primary
        self.fallback = fallback

    def discover(self) -> Discovery:
        first = self.primary.discover()
        if not saw_nothing(first):
            return first
        second = self.fallback.discover()
        if not saw_nothing(second):
            return second
        # Neither could look: say what each said, once.
        return Discovery(problems=first.problems + second.problems, source=self.name)


def real_auto_source() -> AutoSource:
    from .nvidia_smi import NvidiaSmiSource
    from .nvml import real_source

    return AutoSource(real_source(), NvidiaSmiSource())
