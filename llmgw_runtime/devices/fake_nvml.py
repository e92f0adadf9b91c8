"""A fake NVML fed with scenario data, and ready-made scenarios from real machines.

:class:`FakeNvml` answers the :class:`~.nvml.NvmlApi` calls the way NVML does, failures
included: a call before ``init`` is UNINITIALIZED, a value a card lacks is NOT_SUPPORTED, a
MIG device index that holds nothing is NOT_FOUND, and ``FakeCard.fail`` makes any call on
a card (by its NVML name) fail with a chosen code.

The scenarios reproduce the captures in ``shared/fixtures/nvidia-smi/`` (see PROVENANCE.md):
values NVML would return are the captured ones; where a capture has no value (MIG UUIDs,
which ``nvidia-smi -q -x`` does not print) the scenario invents a fixed one and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .nvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    MemoryInfo,
    MigMode,
    NvmlApi,
    NvmlCallError,
    NvmlHandle,
    ProcessInfo,
    RemappedRows,
)

MIB = 2 ** 20

# NVML's own texts for its return codes (nvmlErrorString; pynvml's table).
NVML_MESSAGES = {1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported",
                 4: "Insufficient Permissions", 6: "Not Found", 9: "Driver Not Loaded",
                 12: "NVML Shared Library Not Found", 15: "GPU is lost",
                 18: "RM has detected an NVML/RM version mismatch.", 999: "Unknown Error"}


def nvml_error(call: str, code: int) -> NvmlCallError:
    return NvmlCallError(call, code, NVML_MESSAGES.get(code, f"NVML Error with code {code}"))


@dataclass(frozen=True)
class FakeProcess:
    pid: int
    name: str | None                 # None: nvmlSystemGetProcessName says NOT_FOUND
    used_memory_mb: int | None       # None: NVML reports "not available"
    type: str = "C"                  # "C", "G" or "C+G"


@dataclass(frozen=True)
class FakeMigDevice:
    uuid: str
    profile: str                     # as NVML names it: "<card name> MIG <profile>"
    gpu_instance: int
    compute_instance: int
    memory_total_mb: int
    memory_used_mb: int = 0
    processes: tuple[FakeProcess, ...] = ()
    fail: dict[str, int] = field(default_factory=dict)   # NVML call name -> error code


@dataclass(frozen=True)
class FakeCard:
    """One GPU. ``None`` for a value means NVML answers NOT_SUPPORTED for it."""

    name: str
    uuid: str
    memory_total_mb: int
    memory_used_mb: int = 0
    temperature_c: int | None = None
    power_mw: int | None = None
    utilization_pct: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows: RemappedRows | None = None
    ecc_uncorrected_volatile: int | None = None
    mig_mode: MigMode | None = None          # None: the card has no MIG
    max_mig_devices: int = 7
    mig_devices: tuple[FakeMigDevice, ...] = ()
    processes: tuple[FakeProcess, ...] = ()
    fail: dict[str, int] = field(default_factory=dict)   # NVML call name -> error code


@dataclass(frozen=True)
class _Handle:
    card: int
    mig: int | None = None


class FakeNvml(NvmlApi):
    def __init__(self, cards: list[FakeCard], driver_version: str = "535.54.03",
                 init_error: int | None = None) -> None:
        self.cards = list(cards)
        self.version = driver_version
        self.init_error = init_error
        self.initialised = False
        self.init_calls = 0

    # -- plumbing: how NVML fails -------------------------------------------------------
    def _ready(self, call: str) -> None:
        if not self.initialised:
            raise nvml_error(call, NVML_ERROR_UNINITIALIZED)

    def _card(self, call: str, handle: NvmlHandle, *, mig_ok: bool = False) -> FakeCard:
        self._ready(call)
        if not isinstance(handle, _Handle):
            raise nvml_error(call, NVML_ERROR_INVALID_ARGUMENT)
        if handle.mig is not None and not mig_ok:
            raise nvml_error(call, NVML_ERROR_NOT_SUPPORTED)     # a card-wide value
        card = self.cards[handle.card]
        if handle.mig is None and call in card.fail:
            raise nvml_error(call, card.fail[call])
        return card

    def _either(self, call: str, handle: NvmlHandle) -> FakeCard | FakeMigDevice:
        card = self._card(call, handle, mig_ok=True)
        if handle.mig is None:
            return card
        mig = card.mig_devices[handle.mig]
        if call in mig.fail:
            raise nvml_error(call, mig.fail[call])
        return mig

    def _mig(self, call: str, handle: NvmlHandle) -> FakeMigDevice:
        found = self._either(call, handle)
        if not isinstance(found, FakeMigDevice):
            raise nvml_error(call, NVML_ERROR_INVALID_ARGUMENT)
        return found

    @staticmethod
    def _value(call: str, value: int | bool | None) -> int:
        if value is None:
            raise nvml_error(call, NVML_ERROR_NOT_SUPPORTED)
        return int(value)

    # -- the API ------------------------------------------------------------------------
    def init(self) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            raise nvml_error("nvmlInit", self.init_error)
        self.initialised = True

    def shutdown(self) -> None:
        self._ready("nvmlShutdown")
        self.initialised = False

    def driver_version(self) -> str:
        self._ready("nvmlSystemGetDriverVersion")
        return self.version

    def device_count(self) -> int:
        self._ready("nvmlDeviceGetCount")
        return len(self.cards)

    def device_handle(self, index: int) -> NvmlHandle:
        self._ready("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.cards):
            raise nvml_error("nvmlDeviceGetHandleByIndex", NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(index)
        self._card("nvmlDeviceGetHandleByIndex", handle)
        return handle

    def name(self, handle: NvmlHandle) -> str:
        found = self._either("nvmlDeviceGetName", handle)
        if isinstance(found, FakeMigDevice):
            return f"{self.cards[handle.card].name} MIG {found.profile}"
        return found.name

    def uuid(self, handle: NvmlHandle) -> str:
        return self._either("nvmlDeviceGetUUID", handle).uuid

    def memory(self, handle: NvmlHandle) -> MemoryInfo:
        found = self._either("nvmlDeviceGetMemoryInfo", handle)
        return MemoryInfo(found.memory_total_mb * MIB, found.memory_used_mb * MIB)

    def temperature_c(self, handle: NvmlHandle) -> int:
        call = "nvmlDeviceGetTemperature"
        return self._value(call, self._card(call, handle).temperature_c)

    def power_mw(self, handle: NvmlHandle) -> int:
        call = "nvmlDeviceGetPowerUsage"
        return self._value(call, self._card(call, handle).power_mw)

    def utilization_pct(self, handle: NvmlHandle) -> int:
        call = "nvmlDeviceGetUtilizationRates"
        card = self._card(call, handle)
        if card.mig_mode is not None and card.mig_mode.current:
            raise nvml_error(call, NVML_ERROR_NOT_SUPPORTED)
        return self._value(call, card.utilization_pct)

    def retired_pages_pending(self, handle: NvmlHandle) -> bool:
        call = "nvmlDeviceGetRetiredPagesPendingStatus"
        return bool(self._value(call, self._card(call, handle).retired_pages_pending))

    def remapped_rows(self, handle: NvmlHandle) -> RemappedRows:
        call = "nvmlDeviceGetRemappedRows"
        rows = self._card(call, handle).remapped_rows
        if rows is None:
            raise nvml_error(call, NVML_ERROR_NOT_SUPPORTED)
        return rows

    def ecc_uncorrected_volatile(self, handle: NvmlHandle) -> int:
        call = "nvmlDeviceGetTotalEccErrors"
        return self._value(call, self._card(call, handle).ecc_uncorrected_volatile)

    def _procs(self, call: str, handle: NvmlHandle, kind: str) -> list[ProcessInfo]:
        return [ProcessInfo(p.pid, None if p.used_memory_mb is None
                            else p.used_memory_mb * MIB)
                for p in self._either(call, handle).processes if kind in p.type]

    def compute_processes(self, handle: NvmlHandle) -> list[ProcessInfo]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses", handle, "C")

    def graphics_processes(self, handle: NvmlHandle) -> list[ProcessInfo]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses", handle, "G")

    def process_name(self, pid: int) -> str:
        call = "nvmlSystemGetProcessName"
        self._ready(call)
        for card in self.cards:
            for p in card.processes + tuple(q for m in card.mig_devices for q in m.processes):
                if p.pid == pid and p.name is not None:
                    return p.name
        raise nvml_error(call, NVML_ERROR_NOT_FOUND)

    def mig_mode(self, handle: NvmlHandle) -> MigMode:
        call = "nvmlDeviceGetMigMode"
        mode = self._card(call, handle).mig_mode
        if mode is None:
            raise nvml_error(call, NVML_ERROR_NOT_SUPPORTED)
        return mode

    def max_mig_devices(self, handle: NvmlHandle) -> int:
        call = "nvmlDeviceGetMaxMigDeviceCount"
        card = self._card(call, handle)
        if card.mig_mode is None:
            raise nvml_error(call, NVML_ERROR_NOT_SUPPORTED)
        return card.max_mig_devices

    def mig_device_handle(self, handle: NvmlHandle, index: int) -> NvmlHandle:
        call = "nvmlDeviceGetMigDeviceHandleByIndex"
        card = self._card(call, handle)
        if card.mig_mode is None:
            raise nvml_error(call, NVML_ERROR_NOT_SUPPORTED)
        if not card.mig_mode.current or not 0 <= index < card.max_mig_devices:
            raise nvml_error(call, NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(card.mig_devices):
            raise nvml_error(call, NVML_ERROR_NOT_FOUND)
        return _Handle(handle.card, index)

    def gpu_instance_id(self, handle: NvmlHandle) -> int:
        return self._mig("nvmlDeviceGetGpuInstanceId", handle).gpu_instance

    def compute_instance_id(self, handle: NvmlHandle) -> int:
        return self._mig("nvmlDeviceGetComputeInstanceId", handle).compute_instance


# -- scenarios --------------------------------------------------------------------------

# a100-sxm4-80gb-mig-enabled-4-instances-drv535.xml: the XML has no MIG UUIDs; these are
# invented (uuid5 of "<GPU UUID>/<GI>/<CI>"), for Devices 0-3 = GI 3, 4, 5, 6 (CI 0).
A100_80GB_UUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"
A100_80GB_MIG_UUIDS = ("MIG-25424b3b-1288-564b-b34a-e62217b8932e",
                       "MIG-02139f5c-3320-5312-b206-28a519b2317f",
                       "MIG-98808ce2-8a5a-5473-9502-a8ffe4e679ec",
                       "MIG-ab96b22a-3fe9-52ea-a8a9-32fb2f473f82")
H100_UUID = "GPU-00000000-0000-0000-0000-000000000000"       # masked in the capture
T4_UUID = "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"


def a100_80gb_mig_card(carved: bool = True) -> FakeCard:
    """The A100-SXM4-80GB of the drv535 XML: MIG on, 4 x 1g.20gb (or nothing carved)."""
    migs = tuple(FakeMigDevice(uuid=A100_80GB_MIG_UUIDS[i], profile="1g.20gb",
                               gpu_instance=3 + i, compute_instance=0,
                               memory_total_mb=19968, memory_used_mb=12) for i in range(4))
    return FakeCard(name="NVIDIA A100-SXM4-80GB", uuid=A100_80GB_UUID,
                    memory_total_mb=81920, memory_used_mb=50, temperature_c=27,
                    power_mw=67030, utilization_pct=None,          # N/A with MIG on
                    retired_pages_pending=None, remapped_rows=None,  # N/A in the XML
                    ecc_uncorrected_volatile=0, mig_mode=MigMode(True, True),
                    mig_devices=migs if carved else ())


def h100_card(loaded: bool = False) -> FakeCard:
    """The H100 80GB HBM3 of the drv590 MIG-disabled capture (-q and --query-gpu CSV),
    idle or under its load (gpu-burn and two memhogs)."""
    card = FakeCard(name="NVIDIA H100 80GB HBM3", uuid=H100_UUID, memory_total_mb=81559,
                    memory_used_mb=0, temperature_c=41, power_mw=69850, utilization_pct=0,
                    retired_pages_pending=None, remapped_rows=RemappedRows(0, 0, False, False),
                    ecc_uncorrected_volatile=0, mig_mode=MigMode(False, False))
    if not loaded:
        return card
    return replace(card, memory_used_mb=19818, temperature_c=59, power_mw=631950,
                   utilization_pct=100,
                   processes=(FakeProcess(11327, "/root/tools/memhog", 2566),
                              FakeProcess(11328, "/root/tools/memhog", 1542),
                              FakeProcess(11345, "./gpu_burn", 15690)))


def t4_card() -> FakeCard:
    """The Tesla T4 of tesla-t4-single-datacenter-drv515.xml: no MIG, Xorg and python."""
    return FakeCard(name="Tesla T4", uuid=T4_UUID, memory_total_mb=15360,
                    memory_used_mb=1032, temperature_c=40, power_mw=26780, utilization_pct=0,
                    retired_pages_pending=False, remapped_rows=None,
                    ecc_uncorrected_volatile=0, mig_mode=None,
                    processes=(FakeProcess(675, "/usr/lib/xorg/Xorg", 22, "G"),
                               FakeProcess(5762, "python", 1005, "C")))


def a100_80gb_4_instances() -> FakeNvml:
    return FakeNvml([a100_80gb_mig_card()], driver_version="535.54.03")


def h100_mig_disabled(loaded: bool = False) -> FakeNvml:
    return FakeNvml([h100_card(loaded)], driver_version="590.48.01")


def t4_single() -> FakeNvml:
    return FakeNvml([t4_card()], driver_version="515.105.01")


def mig_enabled_nothing_carved() -> FakeNvml:
    """Synthetic (no capture exists): the A100 with MIG on and every instance destroyed."""
    return FakeNvml([replace(a100_80gb_mig_card(carved=False), memory_used_mb=0)],
                    driver_version="535.54.03")


def mig_change_pending() -> FakeNvml:
    """Synthetic: the idle H100 after ``nvidia-smi -i 0 -mig 1``, before a reset."""
    return FakeNvml([replace(h100_card(), mig_mode=MigMode(False, True))],
                    driver_version="590.48.01")


def no_driver() -> FakeNvml:
    """nvmlInit fails: the library is there, the kernel driver is not loaded."""
    return FakeNvml([], driver_version="", init_error=NVML_ERROR_DRIVER_NOT_LOADED)


def unhealthy_card() -> FakeNvml:
    """Synthetic wear on the T4: retired pages pending and 2 uncorrectable ECC errors."""
    return FakeNvml([replace(t4_card(), retired_pages_pending=True,
                             ecc_uncorrected_volatile=2)], driver_version="515.105.01")
