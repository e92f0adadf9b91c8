"""The NVML source against a fake NVML fed with real captures, and the real pynvml on a
machine without a driver. Nothing is patched: each test hands in an NvmlApi."""

from dataclasses import replace
from typing import Any

import pytest

from llmgw_runtime.devices import fake_nvml as scenarios
from llmgw_runtime.devices.fake_nvml import (
    A100_80GB_MIG_UUIDS,
    A100_80GB_UUID,
    H100_UUID,
    T4_UUID,
    FakeCard,
    FakeMigDevice,
    FakeNvml,
    FakeProcess,
    a100_80gb_mig_card,
    h100_card,
    t4_card,
)
from llmgw_runtime.devices.model import Card, Device
from llmgw_runtime.devices.nvml import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    MigMode,
    NvmlCallError,
    NvmlSource,
    PynvmlApi,
    RemappedRows,
    mig_profile,
)
from llmgw_runtime.devices.sources import source_from_spec

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"


# -- builders ---------------------------------------------------------------------------

def a100_mig(n: int, **changes: Any) -> Device:
    """Device n of the captured A100: GI 3 + n, CI 0, 1g.20gb, 19968 MiB, 12 used."""
    device = Device(id=1000 + n, uuid=A100_80GB_MIG_UUIDS[n], card=0, mig=n,
                    klass="a100-80g-mig-1g.20gb", memory_total_mb=19968, memory_used_mb=12,
                    temperature_c=27.0, power_w=67.03, utilization_pct=None,
                    gpu_instance=3 + n, compute_instance=0, profile="1g.20gb")
    return replace(device, **changes)


def h100_whole(**changes: Any) -> Device:
    device = Device(id=0, uuid=H100_UUID, card=0, klass="h100-80g", memory_total_mb=81559,
                    memory_used_mb=0, temperature_c=41.0, power_w=69.85, utilization_pct=0.0)
    return replace(device, **changes)


def t4_whole(**changes: Any) -> Device:
    device = Device(id=0, uuid=T4_UUID, card=0, klass="t4-16g", memory_total_mb=15360,
                    memory_used_mb=1032, temperature_c=40.0, power_w=26.78,
                    utilization_pct=0.0, processes=(
                        proc(675, "/usr/lib/xorg/Xorg", 22, "G"),
                        proc(5762, "python", 1005, "C")))
    return replace(device, **changes)


def proc(pid: int, name: str | None, mb: int | None, kind: str = "C") -> dict[str, Any]:
    return {"pid": pid, "name": name, "used_memory_mb": mb, "type": kind}


def card(index: int = 0, name: str = H100, uuid: str | None = H100_UUID,
         klass: str | None = "h100-80g", **changes: Any) -> Card:
    return Card(index=index, uuid=uuid, name=name, klass=klass, **changes)


def discover(api: FakeNvml) -> Any:
    return NvmlSource(api).discover()


# -- the captured machines --------------------------------------------------------------

def test_a100_80gb_with_4_instances_gives_four_1g_20gb_devices_as_captured() -> None:
    found = discover(scenarios.a100_80gb_4_instances())
    assert found.devices == [a100_mig(n) for n in range(4)]
    assert [d.label for d in found.devices] == ["0/mig0", "0/mig1", "0/mig2", "0/mig3"]
    assert found.cards == [card(name=A100, uuid=A100_80GB_UUID, klass="a100-80g",
                                mig_current=True, mig_pending=True, instances=4)]
    assert (found.problems, found.source, found.driver_version) == ([], "nvml", "535.54.03")


def test_h100_with_mig_disabled_is_one_whole_gpu_with_utilization() -> None:
    found = discover(scenarios.h100_mig_disabled())
    assert found.devices == [h100_whole()]
    assert found.cards == [card(mig_current=False, mig_pending=False)]
    assert (found.problems, found.driver_version) == ([], "590.48.01")


def test_h100_under_load_lists_its_processes_in_mib() -> None:
    (device,) = discover(scenarios.h100_mig_disabled(loaded=True)).devices
    assert device == h100_whole(memory_used_mb=19818, temperature_c=59.0, power_w=631.95,
                                utilization_pct=100.0, processes=(
                                    proc(11327, "/root/tools/memhog", 2566),
                                    proc(11328, "/root/tools/memhog", 1542),
                                    proc(11345, "./gpu_burn", 15690)))


def test_t4_without_mig_support_has_no_mig_state_and_typed_processes() -> None:
    found = discover(scenarios.t4_single())
    assert found.devices == [t4_whole()]
    assert found.cards == [card(name="Tesla T4", uuid=T4_UUID, klass="t4-16g")]


# -- cards that run nothing ---------------------------------------------------------------

def test_mig_enabled_with_nothing_carved_yields_no_device_and_says_how_to_carve() -> None:
    found = discover(scenarios.mig_enabled_nothing_carved())
    hint = ("create instances, e.g. `nvidia-smi mig -i 0 -cgi 1g.10gb,1g.10gb -C`, or "
            "disable MIG (`nvidia-smi -i 0 -mig 0`)")
    problem = "MIG is enabled but no GPU instance is carved"
    assert found.devices == []
    assert found.cards == [card(name=A100, uuid=A100_80GB_UUID, klass="a100-80g",
                                mig_current=True, mig_pending=True, problem=problem,
                                hint=hint)]
    assert found.problems == [f"card 0 ({A100}): {problem}; {hint}"]


def test_mig_change_pending_yields_no_device_and_says_to_reset() -> None:
    found = discover(scenarios.mig_change_pending())
    problem = "a MIG mode change is pending (now disabled, pending enabled)"
    hint = "reset the GPU (`nvidia-smi -i 0 -r`) or reboot to apply the pending MIG mode"
    assert found.devices == []
    assert found.cards == [card(mig_current=False, mig_pending=True, problem=problem,
                                hint=hint)]
    assert found.problems == [f"card 0 ({H100}): {problem}; {hint}"]


def test_pending_mig_disable_hides_the_instances_still_carved() -> None:
    api = FakeNvml([replace(a100_80gb_mig_card(), mig_mode=MigMode(True, False))])
    found = discover(api)
    assert found.devices == []
    (only,) = found.cards
    assert (only.instances, only.mig_current, only.mig_pending) == (4, True, False)
    assert only.problem == "a MIG mode change is pending (now enabled, pending disabled)"


def test_no_driver_gives_no_devices_and_a_problem_with_nvmls_message() -> None:
    found = discover(scenarios.no_driver())
    assert (found.devices, found.cards, found.driver_version) == ([], [], None)
    (problem,) = found.problems
    assert problem.startswith("NVML cannot start: Driver Not Loaded (nvmlInit, NVML error 9)")
    assert "install the NVIDIA driver and load it" in problem


# -- health -------------------------------------------------------------------------------

def test_retired_pages_pending_and_uncorrectable_ecc_make_the_card_unhealthy() -> None:
    (device,) = discover(scenarios.unhealthy_card()).devices
    assert device == t4_whole(healthy=False, reason=(
        "retired pages are pending: reset the GPU (nvidia-smi -r) or reboot; 2 uncorrectable "
        "ECC errors since the last reset: reset the GPU and watch for more"))


@pytest.mark.parametrize("rows, reason", [
    (RemappedRows(0, 1, True, False),
     "a row remap is pending: reset the GPU (nvidia-smi -r) or reboot"),
    (RemappedRows(0, 9, False, True), "row remapping failed: the card needs service"),
])
def test_row_remap_pending_or_failed_makes_the_card_unhealthy(rows: RemappedRows,
                                                               reason: str) -> None:
    (device,) = discover(FakeNvml([replace(h100_card(), remapped_rows=rows)])).devices
    assert device == h100_whole(healthy=False, reason=reason)


def test_mig_devices_inherit_the_cards_health() -> None:
    api = FakeNvml([replace(a100_80gb_mig_card(), ecc_uncorrected_volatile=1)])
    reason = ("1 uncorrectable ECC errors since the last reset: reset the GPU and watch "
              "for more")
    assert discover(api).devices == [a100_mig(n, healthy=False, reason=reason)
                                     for n in range(4)]


def test_not_supported_values_come_out_as_none_never_zero() -> None:
    bare = FakeCard(name=H100, uuid=H100_UUID, memory_total_mb=81559, processes=(
        FakeProcess(42, None, None),))
    (device,) = discover(FakeNvml([bare])).devices
    assert device == h100_whole(temperature_c=None, power_w=None, utilization_pct=None,
                                processes=(proc(42, None, None),))
    assert discover(FakeNvml([bare])).cards == [card()]        # MIG unsupported: None


# -- errors stay on their card --------------------------------------------------------------

def test_an_nvml_error_on_one_card_does_not_hide_the_others() -> None:
    lost_sensor = replace(h100_card(), fail={"nvmlDeviceGetTemperature": NVML_ERROR_GPU_IS_LOST})
    lost_card = replace(h100_card(), uuid="GPU-2", fail={"nvmlDeviceGetUUID":
                                                         NVML_ERROR_GPU_IS_LOST})
    found = discover(FakeNvml([lost_sensor, t4_card(), lost_card]))
    error = "nvmlDeviceGetTemperature failed: GPU is lost (NVML error 15)"
    assert found.devices == [h100_whole(temperature_c=None, healthy=False, reason=error),
                             t4_whole(id=1, card=1)]
    problem = "NVML cannot read the card: nvmlDeviceGetUUID failed: GPU is lost (NVML error 15)"
    assert found.cards[2] == card(index=2, uuid=None, klass=None, problem=problem, hint=(
        "check it with `nvidia-smi -i 2 -q`; reset it (`nvidia-smi -i 2 -r`) or reboot, "
        "and have it serviced if the error returns"))
    assert found.problems == [f"card 2 ({H100}): {problem}; {found.cards[2].hint}"]


def test_an_nvml_error_on_one_mig_device_marks_only_that_device() -> None:
    base = a100_80gb_mig_card()
    migs = list(base.mig_devices)
    migs[1] = replace(migs[1], fail={"nvmlDeviceGetMemoryInfo": NVML_ERROR_GPU_IS_LOST})
    found = discover(FakeNvml([replace(base, mig_devices=tuple(migs))]))
    error = "nvmlDeviceGetMemoryInfo failed: GPU is lost (NVML error 15)"
    assert found.devices == [a100_mig(0), a100_mig(1, memory_total_mb=0, memory_used_mb=0,
                                                   healthy=False, reason=error),
                             a100_mig(2), a100_mig(3)]


def test_compute_instance_profiles_keep_their_prefix() -> None:
    assert mig_profile("NVIDIA H200 MIG 1c.3g.71gb") == "1c.3g.71gb"
    assert mig_profile("NVIDIA A100-SXM4-80GB MIG 1g.10gb") == "1g.10gb"
    assert mig_profile("NVIDIA A100-SXM4-80GB") is None
    h200 = FakeCard(name="NVIDIA H200", uuid="GPU-h200", memory_total_mb=143771,
                    mig_mode=MigMode(True, True), mig_devices=(
                        FakeMigDevice("MIG-a", "1c.3g.71gb", 2, 0, 71424),
                        FakeMigDevice("MIG-b", "2c.3g.71gb", 2, 1, 71424)))
    found = discover(FakeNvml([h200]))
    assert [(d.id, d.klass, d.gpu_instance, d.compute_instance) for d in found.devices] == [
        (1000, "h200-141g-mig-1c.3g.71gb", 2, 0), (1001, "h200-141g-mig-2c.3g.71gb", 2, 1)]


# -- the source and the fake ------------------------------------------------------------------

def test_discover_shuts_nvml_down_after_each_call() -> None:
    api = scenarios.a100_80gb_4_instances()
    source = NvmlSource(api)
    assert source.discover() == source.discover()
    assert (api.init_calls, api.initialised) == (2, False)


def test_fake_fails_the_way_nvml_does() -> None:
    api = scenarios.a100_80gb_4_instances()

    def code(fn: Any, *args: Any) -> int:
        with pytest.raises(NvmlCallError) as caught:
            fn(*args)
        return caught.value.code

    assert code(api.device_count) == NVML_ERROR_UNINITIALIZED
    api.init()
    gpu = api.device_handle(0)
    assert code(api.device_handle, 1) == NVML_ERROR_INVALID_ARGUMENT
    assert code(api.mig_device_handle, gpu, 4) == NVML_ERROR_NOT_FOUND
    assert code(api.mig_device_handle, gpu, 7) == NVML_ERROR_INVALID_ARGUMENT
    mig = api.mig_device_handle(gpu, 3)
    assert (api.uuid(mig), api.gpu_instance_id(mig)) == (A100_80GB_MIG_UUIDS[3], 6)
    assert api.name(mig) == "NVIDIA A100-SXM4-80GB MIG 1g.20gb"
    assert code(api.temperature_c, mig) == NVML_ERROR_NOT_SUPPORTED
    assert code(api.utilization_pct, gpu) == NVML_ERROR_NOT_SUPPORTED     # MIG on
    assert code(api.gpu_instance_id, gpu) == NVML_ERROR_INVALID_ARGUMENT
    assert code(api.process_name, 1) == NVML_ERROR_NOT_FOUND
    api.shutdown()
    t4 = scenarios.t4_single()
    t4.init()
    assert code(t4.mig_mode, t4.device_handle(0)) == NVML_ERROR_NOT_SUPPORTED


def test_nvml_is_a_device_source_spec() -> None:
    assert isinstance(source_from_spec("nvml"), NvmlSource)


def test_real_pynvml_without_a_driver_reports_the_error_and_the_fix() -> None:
    found = NvmlSource(PynvmlApi()).discover()
    if found.cards:
        pytest.skip("this machine has a working NVIDIA driver")
    assert (found.devices, found.source) == ([], "nvml")
    (problem,) = found.problems
    assert problem.startswith("NVML cannot start: ")
    assert "(nvmlInit, NVML error " in problem      # e.g. NVML Shared Library Not Found
    assert "install the NVIDIA driver and load it" in problem
