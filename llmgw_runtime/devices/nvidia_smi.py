"""The ``nvidia-smi`` device source: ``nvidia-smi -L`` and ``nvidia-smi -q -x`` joined.

The XML has memory, processes, health and the MIG devices (GPU/compute instance ids), but
no MIG UUID and no profile; ``-L`` has those. A MIG device in the XML is joined to its -L
line by (GPU instance, compute instance) when the -L UUID carries them (the legacy
``MIG-GPU-<uuid>/<gi>/<ci>`` form), else by enumeration index (``Device N`` in -L is the
XML ``<index>``; it is never a GPU instance id).

Pure parse functions (:func:`parse_list`, :func:`~.nvidia_smi_xml.parse_xml`,
:func:`discover_from`) and a thin :class:`NvidiaSmiSource` that gets the two texts from a
:class:`NvidiaSmiRunner`: :class:`SubprocessRunner` (real) or :class:`FileRunner`
(captured output, for tests and machines without GPUs).
"""

from __future__ import annotations

import logging
import re
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from ..fleetvocab import placement_id
from .classes import gpu_class, mig_class
from .health import health_reason
from .model import Card, Device, Discovery
from .nvidia_smi_xml import NvidiaSmiError, XmlGpu, XmlMigDevice, parse_xml
from .sources import DeviceSource

log = logging.getLogger(__name__)

SOURCE = "nvidia-smi"
_GPU_LINE = re.compile(r"^GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*([^)\s]+)\s*\)\s*$")
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*([^)\s]+)\s*\)\s*$")
_LEGACY_MIG_UUID = re.compile(r"^MIG-GPU-[0-9A-Fa-f-]+/(\d+)/(\d+)$")
DRIVER_HINT = ("install the NVIDIA driver and load it (`nvidia-smi` must list the cards), "
               "or run the agent with --devices cpu on a machine without GPUs")


@dataclass(frozen=True)
class ListedMig:
    """One ``MIG <profile> Device N: (UUID: ...)`` line. ``gpu_instance`` and
    ``compute_instance`` are set only by the legacy ``MIG-GPU-<uuid>/<gi>/<ci>`` UUID."""

    index: int                  # Device N: the enumeration index
    profile: str                # 3g.40gb, or a compute-instance profile like 1c.3g.71gb
    uuid: str                   # as -L prints it; what CUDA_VISIBLE_DEVICES takes
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class ListedGpu:
    """One ``GPU N: <name> (UUID: GPU-...)`` line and the MIG lines under it."""

    index: int
    name: str
    uuid: str
    migs: tuple[ListedMig, ...] = ()


def parse_list(text: str) -> list[ListedGpu]:
    """Parse ``nvidia-smi -L`` (old and new MIG forms, padded or not, CRLF or LF)."""
    gpus: list[ListedGpu] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        gpu = _GPU_LINE.match(line)
        if gpu:
            gpus.append(ListedGpu(index=int(gpu.group(1)), name=gpu.group(2),
                                  uuid=gpu.group(3)))
            continue
        mig = _MIG_LINE.match(line)
        if mig and gpus:
            legacy = _LEGACY_MIG_UUID.match(mig.group(3))
            entry = ListedMig(
                index=int(mig.group(2)), profile=mig.group(1), uuid=mig.group(3),
                gpu_instance=int(legacy.group(1)) if legacy else None,
                compute_instance=int(legacy.group(2)) if legacy else None)
            last = gpus[-1]
            gpus[-1] = ListedGpu(last.index, last.name, last.uuid, last.migs + (entry,))
            continue
        log.debug("nvidia-smi -L: line not understood, skipped: %r", line)
    return gpus


def _where(gpu: XmlGpu) -> str:
    return f"card {gpu.position} ({gpu.product_name})"


@dataclass
class _CardResult:
    card: Card
    devices: list[Device]
    problems: list[str]


def _idle(gpu: XmlGpu, klass: str | None, problem: str, hint: str) -> _CardResult:
    card = Card(index=gpu.position, uuid=gpu.uuid, name=gpu.product_name, klass=klass,
                mig_current=gpu.mig_current, mig_pending=gpu.mig_pending,
                instances=len(gpu.mig_devices), problem=problem, hint=hint)
    return _CardResult(card, [], [f"{_where(gpu)}: {problem}; {hint}"])


def _match(xml_mig: XmlMigDevice, listed: ListedGpu) -> ListedMig | None:
    """The -L line of a MIG device: by (gi, ci) when -L carries them, else by index."""
    for entry in listed.migs:
        if entry.gpu_instance is not None:
            if (entry.gpu_instance, entry.compute_instance) == (
                    xml_mig.gpu_instance, xml_mig.compute_instance):
                return entry
        elif entry.index == xml_mig.index:
            return entry
    return None


def _whole_gpu(gpu: XmlGpu, klass: str, uuid: str) -> Device:
    reason = health_reason(gpu.health)
    used = gpu.memory_used_mb
    if used is None and gpu.memory_total_mb is not None and gpu.memory_free_mb is not None:
        used = gpu.memory_total_mb - gpu.memory_free_mb
    return Device(
        id=placement_id(gpu.position, None), uuid=uuid, card=gpu.position, klass=klass,
        memory_total_mb=gpu.memory_total_mb or 0, memory_used_mb=used or 0, mig=None,
        processes=tuple(p.to_dict() for p in gpu.processes),
        temperature_c=gpu.temperature_c, power_w=gpu.power_w,
        utilization_pct=gpu.utilization_pct, healthy=reason is None, reason=reason)


def _mig_devices(gpu: XmlGpu, card_class: str, listed: ListedGpu
                 ) -> tuple[list[Device], list[str]]:
    reason = health_reason(gpu.health)
    devices: list[Device] = []
    problems: list[str] = []
    used_entries: set[int] = set()
    for xml_mig in gpu.mig_devices:
        entry = _match(xml_mig, listed)
        what = (f"MIG device {xml_mig.index} (GPU instance {xml_mig.gpu_instance}, "
                f"compute instance {xml_mig.compute_instance})")
        if entry is None:
            problems.append(f"{_where(gpu)}: {what} is not in `nvidia-smi -L`, so its UUID "
                            "and profile are unknown and it is left out; a MIG change may "
                            "be in progress: discovery runs again next cycle")
            continue
        if xml_mig.memory_total_mb is None:
            problems.append(f"{_where(gpu)}: {what} reports no memory total; it is left out")
            continue
        used_entries.add(entry.index)
        processes = tuple(
            p.to_dict() for p in gpu.processes
            if (p.gpu_instance, p.compute_instance) == (xml_mig.gpu_instance,
                                                          xml_mig.compute_instance))
        devices.append(Device(
            id=placement_id(gpu.position, entry.index), uuid=entry.uuid, card=gpu.position,
            klass=mig_class(card_class, entry.profile), mig=entry.index,
            memory_total_mb=xml_mig.memory_total_mb,
            memory_used_mb=xml_mig.memory_used_mb or 0, processes=processes,
            temperature_c=gpu.temperature_c, power_w=gpu.power_w, utilization_pct=None,
            healthy=reason is None, reason=reason,
            gpu_instance=xml_mig.gpu_instance, compute_instance=xml_mig.compute_instance,
            profile=entry.profile))
    for entry in listed.migs:
        if entry.index not in used_entries:
            problems.append(f"{_where(gpu)}: `nvidia-smi -L` lists MIG Device {entry.index} "
                            f"({entry.profile}, {entry.uuid}) that `nvidia-smi -q -x` does "
                            "not describe; it is left out until both agree")
    return sorted(devices, key=lambda d: d.id), problems


def _card(gpu: XmlGpu, listed: ListedGpu | None, have_list: bool) -> _CardResult:
    """The card and its devices, or the reason it can run nothing."""
    klass = (gpu_class(gpu.product_name, gpu.memory_total_mb)
             if gpu.memory_total_mb is not None else None)
    uuid = gpu.uuid or (listed.uuid if listed else None)
    i = gpu.position
    if klass is None or uuid is None:
        missing = "memory total" if klass is None else "UUID"
        return _idle(gpu, klass, f"nvidia-smi reports no {missing} for it",
                     f"run `nvidia-smi -q -i {i}` to see what the driver says; reset the GPU "
                     f"(`nvidia-smi -i {i} -r`) if it looks lost")
    if (gpu.mig_current is not None and gpu.mig_pending is not None
            and gpu.mig_current != gpu.mig_pending):
        now, then = (("enabled", "disabled") if gpu.mig_current
                     else ("disabled", "enabled"))
        return _idle(gpu, klass, f"a MIG mode change is pending (MIG is {now}, will be "
                     f"{then})", f"reset the GPU (`nvidia-smi -i {i} -r`) or reboot to apply "
                     "the pending MIG mode")
    if gpu.mig_current:
        if not gpu.mig_devices:
            return _idle(gpu, klass, "MIG is enabled but no MIG instance is created",
                         f"create instances, e.g. `nvidia-smi mig -i {i} -cgi "
                         "1g.10gb,1g.10gb -C`, or disable MIG "
                         f"(`nvidia-smi -i {i} -mig 0`)")
        if listed is None:
            said = ("was not read" if not have_list
                    else f"does not list this card ({uuid})")
            return _idle(gpu, klass, f"it has {len(gpu.mig_devices)} MIG device(s), but "
                         f"their UUIDs and profiles come only from `nvidia-smi -L`, which "
                         f"{said}", "give the source `nvidia-smi -L` output as well as "
                         "`nvidia-smi -q -x`")
        devices, problems = _mig_devices(gpu, klass, listed)
        card = Card(index=i, uuid=uuid, name=gpu.product_name, klass=klass,
                    mig_current=True, mig_pending=gpu.mig_pending,
                    instances=len(gpu.mig_devices))
        return _CardResult(card, devices, problems)
    card = Card(index=i, uuid=uuid, name=gpu.product_name, klass=klass,
                mig_current=gpu.mig_current, mig_pending=gpu.mig_pending)
    return _CardResult(card, [_whole_gpu(gpu, klass, uuid)], [])


def discover_from(list_text: str | None, xml_text: str) -> Discovery:
    """Devices, cards and problems from the two outputs (``list_text`` None: -L not read)."""
    try:
        parsed = parse_xml(xml_text)
    except NvidiaSmiError as exc:
        return Discovery(problems=[f"nvidia-smi: {exc.message}"], source=SOURCE)
    listed = parse_list(list_text) if list_text is not None else []
    by_uuid = {g.uuid: g for g in listed}
    by_index = {g.index: g for g in listed}
    devices: list[Device] = []
    cards: list[Card] = []
    problems: list[str] = []
    for gpu in parsed.gpus:
        match = by_uuid.get(gpu.uuid) if gpu.uuid else by_index.get(gpu.position)
        result = _card(gpu, match, list_text is not None)
        devices.extend(result.devices)
        cards.append(result.card)
        problems.extend(result.problems)
    if not parsed.gpus:
        problems.append(f"nvidia-smi: no GPU in `nvidia-smi -q -x`; {DRIVER_HINT}")
    return Discovery(devices=devices, problems=problems, cards=cards, source=SOURCE,
                     driver_version=parsed.driver_version)


class NvidiaSmiRunner(ABC):
    """Where the two texts come from. Both raise NvidiaSmiError saying what to do."""

    @abstractmethod
    def list_gpus(self) -> str:
        """The output of ``nvidia-smi -L``."""

    @abstractmethod
    def query_xml(self) -> str:
        """The output of ``nvidia-smi -q -x``."""


class SubprocessRunner(NvidiaSmiRunner):
    """Runs the real binary."""

    def __init__(self, binary: str = "nvidia-smi", timeout: float = 15.0) -> None:
        self.binary = binary
        self.timeout = timeout

    def _run(self, *args: str) -> str:
        command = " ".join((self.binary, *args))
        try:
            done = subprocess.run([self.binary, *args], capture_output=True, text=True,
                                  timeout=self.timeout, check=False)
        except FileNotFoundError:
            raise NvidiaSmiError(f"`{self.binary}` is not installed or not on PATH; "
                                 + DRIVER_HINT) from None
        except PermissionError:
            raise NvidiaSmiError(f"`{self.binary}` cannot be run (permission denied); "
                                 "check the file's mode and the agent's user") from None
        except subprocess.TimeoutExpired:
            raise NvidiaSmiError(f"`{command}` did not answer within {self.timeout:g} s; "
                                 "the driver may be hung: look for Xid errors in `dmesg`, "
                                 "then reset the GPU or reboot") from None
        if done.returncode != 0:
            said = " ".join((done.stdout + " " + done.stderr).split())[:300] or "no output"
            raise NvidiaSmiError(f"`{command}` failed with exit status {done.returncode}: "
                                 f"{said}; {DRIVER_HINT}")
        return done.stdout

    def list_gpus(self) -> str:
        return self._run("-L")

    def query_xml(self) -> str:
        return self._run("-q", "-x")


class FileRunner(NvidiaSmiRunner):
    """Captured output read from files (tests, ``make up`` without GPUs)."""

    def __init__(self, list_path: str | Path, xml_path: str | Path) -> None:
        self.list_path = Path(list_path)
        self.xml_path = Path(xml_path)

    @staticmethod
    def _read(path: Path, what: str) -> str:
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise NvidiaSmiError(f"captured `{what}` output {path}: cannot read it: "
                                 f"{exc.strerror or exc}") from None

    def list_gpus(self) -> str:
        return self._read(self.list_path, "nvidia-smi -L")

    def query_xml(self) -> str:
        return self._read(self.xml_path, "nvidia-smi -q -x")


class NvidiaSmiSource(DeviceSource):
    """Devices as ``nvidia-smi`` reports them; a runner failure yields no devices and one
    problem saying what failed and what to do."""

    name = SOURCE

    def __init__(self, runner: NvidiaSmiRunner | None = None) -> None:
        self.runner = runner or SubprocessRunner()
        self._last_problems: list[str] = []

    def discover(self) -> Discovery:
        try:
            xml_text = self.runner.query_xml()
            list_text = self.runner.list_gpus()
        except NvidiaSmiError as exc:
            found = Discovery(problems=[f"nvidia-smi: {exc.message}"], source=SOURCE)
        else:
            found = discover_from(list_text, xml_text)
        if found.problems != self._last_problems:
            for problem in found.problems:
                log.warning("%s", problem)
            self._last_problems = list(found.problems)
        return found
