"""The NVML device source: cards, MIG instances, memory, temperature, power, wear and
processes, read through nvidia-ml-py (``pynvml``).

Every NVML call goes through :class:`NvmlApi`, a small interface that returns plain Python
values and raises one :class:`NvmlCallError`. :class:`PynvmlApi` is the real one;
``fake_nvml.FakeNvml`` is the fake the tests hand in. ``NVML_ERROR_NOT_SUPPORTED`` is an
error like any other at the interface; :class:`NvmlSource` turns it into "absent" (None),
never into zero, and any other error on a card into that card's devices being unhealthy.

:meth:`NvmlSource.discover` initialises NVML, reads everything and shuts NVML down again on
every call. A report cycle is seconds apart, so the init cost does not matter, and a driver
that is reloaded or a MIG layout that changes between cycles is seen at the next one.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..errors import DeviceError
from ..fleetvocab import placement_id
from .classes import gpu_class, mig_class
from .health import HealthFacts, health_reason
from .model import Card, Device, Discovery
from .sources import DeviceSource

log = logging.getLogger(__name__)

# NVML return codes (nvml.h; the same numbers as pynvml.NVML_ERROR_*).
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

MIB = 2 ** 20
NvmlHandle = Any        # an opaque device handle: pynvml's c_nvmlDevice_t, or a fake's
T = TypeVar("T")


class NvmlCallError(DeviceError):
    """One NVML call failed: ``call`` is the NVML function, ``code`` its return code and
    ``nvml_message`` NVML's own text for it (``Driver Not Loaded``)."""

    def __init__(self, call: str, code: int, message: str) -> None:
        super().__init__(f"{call} failed: {message} (NVML error {code})")
        self.call = call
        self.code = code
        self.nvml_message = message


@dataclass(frozen=True)
class MemoryInfo:
    total: int      # bytes
    used: int       # bytes, not counting what the driver reserves


@dataclass(frozen=True)
class RemappedRows:
    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_memory: int | None     # bytes; None when NVML does not know (Windows WDDM)


@dataclass(frozen=True)
class MigMode:
    current: bool
    pending: bool


class NvmlApi(ABC):
    """The NVML calls the source needs. Each raises :class:`NvmlCallError` on failure,
    with the code NVML returned (NOT_SUPPORTED, NOT_FOUND, GPU_IS_LOST...)."""

    @abstractmethod
    def init(self) -> None: ...                                   # nvmlInit
    @abstractmethod
    def shutdown(self) -> None: ...                               # nvmlShutdown
    @abstractmethod
    def driver_version(self) -> str: ...                          # nvmlSystemGetDriverVersion
    @abstractmethod
    def device_count(self) -> int: ...                            # nvmlDeviceGetCount
    @abstractmethod
    def device_handle(self, index: int) -> NvmlHandle: ...        # nvmlDeviceGetHandleByIndex
    @abstractmethod
    def name(self, handle: NvmlHandle) -> str: ...                # nvmlDeviceGetName
    @abstractmethod
    def uuid(self, handle: NvmlHandle) -> str: ...                # nvmlDeviceGetUUID
    @abstractmethod
    def memory(self, handle: NvmlHandle) -> MemoryInfo: ...       # nvmlDeviceGetMemoryInfo
    @abstractmethod
    def temperature_c(self, handle: NvmlHandle) -> int: ...       # nvmlDeviceGetTemperature
    @abstractmethod
    def power_mw(self, handle: NvmlHandle) -> int: ...            # nvmlDeviceGetPowerUsage
    @abstractmethod
    def utilization_pct(self, handle: NvmlHandle) -> int: ...     # ...GetUtilizationRates.gpu
    @abstractmethod
    def retired_pages_pending(self, handle: NvmlHandle) -> bool: ...
    @abstractmethod
    def remapped_rows(self, handle: NvmlHandle) -> RemappedRows: ...
    @abstractmethod
    def ecc_uncorrected_volatile(self, handle: NvmlHandle) -> int: ...  # ...GetTotalEccErrors
    @abstractmethod
    def compute_processes(self, handle: NvmlHandle) -> list[ProcessInfo]: ...
    @abstractmethod
    def graphics_processes(self, handle: NvmlHandle) -> list[ProcessInfo]: ...
    @abstractmethod
    def process_name(self, pid: int) -> str: ...                  # nvmlSystemGetProcessName
    @abstractmethod
    def mig_mode(self, handle: NvmlHandle) -> MigMode: ...        # nvmlDeviceGetMigMode
    @abstractmethod
    def max_mig_devices(self, handle: NvmlHandle) -> int: ...     # ...GetMaxMigDeviceCount
    @abstractmethod
    def mig_device_handle(self, handle: NvmlHandle, index: int) -> NvmlHandle: ...
    @abstractmethod
    def gpu_instance_id(self, handle: NvmlHandle) -> int: ...     # of a MIG device handle
    @abstractmethod
    def compute_instance_id(self, handle: NvmlHandle) -> int: ...


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class PynvmlApi(NvmlApi):
    """The real NVML through nvidia-ml-py. Bytes come back as str; errors as NvmlCallError."""

    def __init__(self) -> None:
        import pynvml
        self._nv: Any = pynvml

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self._nv, name)(*args)
        except self._nv.NVMLError as exc:
            raise NvmlCallError(name, int(exc.value), str(exc)) from None

    def init(self) -> None:
        self._call("nvmlInit")

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def device_handle(self, index: int) -> NvmlHandle:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def name(self, handle: NvmlHandle) -> str:
        return _text(self._call("nvmlDeviceGetName", handle))

    def uuid(self, handle: NvmlHandle) -> str:
        return _text(self._call("nvmlDeviceGetUUID", handle))

    def memory(self, handle: NvmlHandle) -> MemoryInfo:
        # v2 reports what the driver reserves apart from "used", as nvidia-smi shows it.
        try:
            info = self._call("nvmlDeviceGetMemoryInfo", handle, self._nv.nvmlMemory_v2)
        except NvmlCallError:
            info = self._call("nvmlDeviceGetMemoryInfo", handle)
        return MemoryInfo(total=int(info.total), used=int(info.used))

    def temperature_c(self, handle: NvmlHandle) -> int:
        return int(self._call("nvmlDeviceGetTemperature", handle, self._nv.NVML_TEMPERATURE_GPU))

    def power_mw(self, handle: NvmlHandle) -> int:
        return int(self._call("nvmlDeviceGetPowerUsage", handle))

    def utilization_pct(self, handle: NvmlHandle) -> int:
        return int(self._call("nvmlDeviceGetUtilizationRates", handle).gpu)

    def retired_pages_pending(self, handle: NvmlHandle) -> bool:
        return bool(self._call("nvmlDeviceGetRetiredPagesPendingStatus", handle))

    def remapped_rows(self, handle: NvmlHandle) -> RemappedRows:
        corr, unc, pending, failure = self._call("nvmlDeviceGetRemappedRows", handle)
        return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))

    def ecc_uncorrected_volatile(self, handle: NvmlHandle) -> int:
        return int(self._call("nvmlDeviceGetTotalEccErrors", handle,
                              self._nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                              self._nv.NVML_VOLATILE_ECC))

    def _processes(self, call: str, handle: NvmlHandle) -> list[ProcessInfo]:
        return [ProcessInfo(int(p.pid), None if p.usedGpuMemory is None
                            else int(p.usedGpuMemory)) for p in self._call(call, handle)]

    def compute_processes(self, handle: NvmlHandle) -> list[ProcessInfo]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses", handle)

    def graphics_processes(self, handle: NvmlHandle) -> list[ProcessInfo]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", handle)

    def process_name(self, pid: int) -> str:
        return _text(self._call("nvmlSystemGetProcessName", pid))

    def mig_mode(self, handle: NvmlHandle) -> MigMode:
        current, pending = self._call("nvmlDeviceGetMigMode", handle)
        on = self._nv.NVML_DEVICE_MIG_ENABLE
        return MigMode(current == on, pending == on)

    def max_mig_devices(self, handle: NvmlHandle) -> int:
        return int(self._call("nvmlDeviceGetMaxMigDeviceCount", handle))

    def mig_device_handle(self, handle: NvmlHandle, index: int) -> NvmlHandle:
        return self._call("nvmlDeviceGetMigDeviceHandleByIndex", handle, index)

    def gpu_instance_id(self, handle: NvmlHandle) -> int:
        return int(self._call("nvmlDeviceGetGpuInstanceId", handle))

    def compute_instance_id(self, handle: NvmlHandle) -> int:
        return int(self._call("nvmlDeviceGetComputeInstanceId", handle))


def mig_profile(mig_device_name: str) -> str | None:
    """``NVIDIA A100-SXM4-80GB MIG 1g.10gb`` -> ``1g.10gb``; ``... MIG 1c.3g.71gb`` keeps
    the compute-instance prefix. None when the name carries no profile."""
    _, sep, profile = mig_device_name.rpartition(" MIG ")
    return (profile.strip() or None) if sep else None


class _Reader:
    """Calls NVML for one card or MIG device: NOT_SUPPORTED gives None; any other error
    gives None too and is kept in ``errors`` (it makes the card unhealthy)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def get(self, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except NvmlCallError as exc:
            if exc.code != NVML_ERROR_NOT_SUPPORTED:
                self.errors.append(str(exc))
            return None


def _on_off(value: bool) -> str:
    return "enabled" if value else "disabled"


def _service_hint(index: int) -> str:
    return (f"check it with `nvidia-smi -i {index} -q`; reset it (`nvidia-smi -i {index} -r`) "
            "or reboot, and have it serviced if the error returns")


class NvmlSource(DeviceSource):
    """Devices from NVML: a whole GPU per card without MIG, a device per MIG instance."""

    name = "nvml"

    def __init__(self, api: NvmlApi) -> None:
        self.api = api

    def discover(self) -> Discovery:
        try:
            self.api.init()
        except NvmlCallError as exc:
            return Discovery(source=self.name, problems=[
                f"NVML cannot start: {exc.nvml_message} ({exc.call}, NVML error {exc.code}): "
                "install the NVIDIA driver and load it (`nvidia-smi` must list the cards), "
                "or run the agent with --devices cpu on a machine without GPUs"])
        try:
            return self._read()
        finally:
            try:
                self.api.shutdown()
            except NvmlCallError as exc:
                log.debug("NVML shutdown: %s", exc)

    def _read(self) -> Discovery:
        try:
            driver: str | None = self.api.driver_version()
        except NvmlCallError:
            driver = None
        try:
            count = self.api.device_count()
        except NvmlCallError as exc:
            return Discovery(source=self.name, driver_version=driver,
                             problems=[f"NVML cannot count the GPUs: {exc}: check the driver "
                                       "with `nvidia-smi`, or reboot"])
        devices: list[Device] = []
        cards: list[Card] = []
        problems: list[str] = []
        for index in range(count):
            card, found = self._card(index)
            cards.append(card)
            devices.extend(found)
            if card.problem:
                problems.append(f"card {index} ({card.name}): {card.problem}; {card.hint}")
        return Discovery(devices=devices, problems=problems, cards=cards, source=self.name,
                         driver_version=driver)

    def _card(self, index: int) -> tuple[Card, list[Device]]:
        api, r = self.api, _Reader()
        name: str | None = None
        uuid: str | None = None
        try:
            handle = api.device_handle(index)
            name = api.name(handle)
            uuid = api.uuid(handle)
            mem = api.memory(handle)
        except NvmlCallError as exc:
            return Card(index=index, uuid=uuid, name=name or "unknown GPU", klass=None,
                        problem=f"NVML cannot read the card: {exc}",
                        hint=_service_hint(index)), []
        total_mb = mem.total // MIB
        klass = gpu_class(name, total_mb)
        rows = r.get(api.remapped_rows, handle)
        retired = r.get(api.retired_pages_pending, handle)
        ecc = r.get(api.ecc_uncorrected_volatile, handle)
        temp = r.get(api.temperature_c, handle)
        power = r.get(api.power_mw, handle)
        mig = r.get(api.mig_mode, handle)
        shared: dict[str, Any] = {
            "card": index,
            "temperature_c": None if temp is None else float(temp),
            "power_w": None if power is None else power / 1000}
        card = Card(index=index, uuid=uuid, name=name, klass=klass,
                    mig_current=mig.current if mig else None,
                    mig_pending=mig.pending if mig else None)

        def health(extra: list[str]) -> dict[str, Any]:
            reason = health_reason(HealthFacts(
                retired_pages_pending=retired,
                remap_failure=rows.failure if rows else None,
                remap_pending=rows.pending if rows else None,
                uncorrectable_ecc_volatile=ecc, errors=tuple(r.errors + extra)))
            return {"healthy": reason is None, "reason": reason}

        if mig is None or not (mig.current or mig.pending):
            util = r.get(api.utilization_pct, handle)
            processes = self._processes(r, handle)
            return card, [Device(
                id=placement_id(index, None), uuid=uuid, klass=klass,
                memory_total_mb=total_mb, memory_used_mb=mem.used // MIB,
                processes=processes, utilization_pct=None if util is None else float(util),
                **shared, **health([]))]

        found = self._mig_devices(r, handle, index, klass) if mig.current else []
        devices = [Device(**fields, **shared, **health(errs)) for fields, errs in found]
        card = replace(card, instances=len(devices))
        if mig.current != mig.pending:
            return replace(card, problem=f"a MIG mode change is pending (now "
                                         f"{_on_off(mig.current)}, pending "
                                         f"{_on_off(mig.pending)})",
                           hint=f"reset the GPU (`nvidia-smi -i {index} -r`) or reboot to "
                                "apply the pending MIG mode"), []
        if not devices:
            if r.errors:
                problem = "NVML cannot list its MIG devices: " + "; ".join(r.errors)
                hint = _service_hint(index)
            else:
                problem = "MIG is enabled but no GPU instance is carved"
                hint = (f"create instances, e.g. `nvidia-smi mig -i {index} -cgi "
                        "1g.10gb,1g.10gb -C`, or disable MIG "
                        f"(`nvidia-smi -i {index} -mig 0`)")
            return replace(card, problem=problem, hint=hint), []
        return card, devices

    def _mig_devices(self, r: _Reader, handle: NvmlHandle, index: int,
                     card_class: str) -> list[tuple[dict[str, Any], list[str]]]:
        """Each MIG device's own fields and its own errors, in NVML's index order."""
        api = self.api
        out: list[tuple[dict[str, Any], list[str]]] = []
        for mi in range(r.get(api.max_mig_devices, handle) or 0):
            try:
                mh = api.mig_device_handle(handle, mi)
                uuid = api.uuid(mh)
            except NvmlCallError as exc:
                if exc.code != NVML_ERROR_NOT_FOUND:
                    r.errors.append(f"MIG device {mi}: {exc}")
                continue
            m = _Reader()
            name = m.get(api.name, mh) or ""
            profile = mig_profile(name)
            if profile is None:
                m.errors.append(f"MIG device {mi}: no profile in NVML's name {name!r}")
            mem = m.get(api.memory, mh) or MemoryInfo(0, 0)
            out.append(({
                "id": placement_id(index, mi), "uuid": uuid, "mig": mi,
                "klass": mig_class(card_class, profile or "unknown"),
                "memory_total_mb": mem.total // MIB, "memory_used_mb": mem.used // MIB,
                "processes": self._processes(m, mh),
                "gpu_instance": m.get(api.gpu_instance_id, mh),
                "compute_instance": m.get(api.compute_instance_id, mh),
                "profile": profile}, m.errors))
        return out

    def _processes(self, r: _Reader, handle: NvmlHandle) -> tuple[dict[str, Any], ...]:
        """Compute ("C") and graphics ("G") processes by pid; one in both is "C+G"."""
        merged: dict[int, dict[str, Any]] = {}
        for kind, call in (("C", self.api.compute_processes),
                           ("G", self.api.graphics_processes)):
            for p in r.get(call, handle) or []:
                if p.pid in merged:
                    merged[p.pid]["type"] = "C+G"
                    continue
                try:
                    pname: str | None = self.api.process_name(p.pid) or None
                except NvmlCallError:
                    pname = None        # gone already, or not ours to see
                merged[p.pid] = {"pid": p.pid, "name": pname,
                                 "used_memory_mb": None if p.used_memory is None
                                 else p.used_memory // MIB, "type": kind}
        return tuple(merged[pid] for pid in sorted(merged))


def real_source() -> NvmlSource:
    """The source ``--devices nvml`` gives: NVML through nvidia-ml-py."""
    return NvmlSource(PynvmlApi())
