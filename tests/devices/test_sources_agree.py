"""NVML and nvidia-smi describe the same machine the same way: the A100-SXM4-80GB with four
1g.20gb instances of the shared XML capture, seen through the fake NVML built from it and
through nvidia-smi's captured XML joined with its -L listing."""

from __future__ import annotations

from pathlib import Path

from llmgw_runtime.devices import fake_nvml
from llmgw_runtime.devices.auto import AutoSource
from llmgw_runtime.devices.nvidia_smi import FileRunner, NvidiaSmiSource
from llmgw_runtime.devices.nvml import NvmlSource

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "fixtures" / "nvidia-smi"
OWN = ROOT / "tests" / "fixtures" / "nvidia-smi-own"


def smi_source() -> NvidiaSmiSource:
    return NvidiaSmiSource(FileRunner(OWN / "a100-sxm4-80gb-mig-4x1g.20gb-L.txt",
                                      SHARED / "a100-sxm4-80gb-mig-enabled-4-instances-drv535.xml"))


def test_nvml_and_nvidia_smi_give_the_same_devices_for_the_same_machine() -> None:
    by_nvml = NvmlSource(fake_nvml.a100_80gb_4_instances()).discover()
    by_smi = smi_source().discover()
    assert by_nvml.problems == by_smi.problems == []
    assert by_nvml.devices == by_smi.devices
    assert [d.label for d in by_nvml.devices] == ["0/mig0", "0/mig1", "0/mig2", "0/mig3"]
    assert {d.klass for d in by_nvml.devices} == {"a100-80g-mig-1g.20gb"}
    assert by_nvml.driver_version == by_smi.driver_version == "535.54.03"
    strip = [(c.index, c.uuid, c.name, c.klass, c.mig_current, c.mig_pending, c.instances,
              c.problem) for c in by_nvml.cards]
    assert strip == [(c.index, c.uuid, c.name, c.klass, c.mig_current, c.mig_pending,
                      c.instances, c.problem) for c in by_smi.cards]


def test_auto_falls_back_to_nvidia_smi_when_nvml_cannot_start() -> None:
    found = AutoSource(NvmlSource(fake_nvml.no_driver()), smi_source()).discover()
    assert found.source == "nvidia-smi" and len(found.devices) == 4


def test_auto_uses_nvml_when_it_works_and_reports_both_when_neither_does() -> None:
    nvml = NvmlSource(fake_nvml.a100_80gb_4_instances())
    assert AutoSource(nvml, smi_source()).discover().source == "nvml"
    broken = NvidiaSmiSource(FileRunner(OWN / "missing-L.txt", OWN / "missing.xml"))
    neither = AutoSource(NvmlSource(fake_nvml.no_driver()), broken).discover()
    assert neither.devices == [] and len(neither.problems) == 2
    assert "NVML" in neither.problems[0] and "nvidia-smi" in neither.problems[1]
