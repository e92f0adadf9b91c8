"""The nvidia-smi device source, fed with real captures (../shared/fixtures/nvidia-smi) and
with samples we wrote for cases no capture shows (tests/fixtures/nvidia-smi-own)."""

from __future__ import annotations

import logging
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.devices import Device, Discovery, source_from_spec
from llmgw_runtime.devices.fake_nvml import A100_80GB_MIG_UUIDS
from llmgw_runtime.devices.model import Card
from llmgw_runtime.devices.nvidia_smi import (
    FileRunner,
    ListedGpu,
    ListedMig,
    NvidiaSmiRunner,
    NvidiaSmiSource,
    SubprocessRunner,
    discover_from,
    parse_list,
)
from llmgw_runtime.devices.nvidia_smi_xml import NvidiaSmiError, parse_xml
from llmgw_runtime.fleetvocab import placement_id
from tests.support.captures import list_section

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "fixtures" / "nvidia-smi"
OWN = REPO / "tests" / "fixtures" / "nvidia-smi-own"

H100_CAPTURE = "h100-80gb-hbm3-mig-4-instances-drv590-capture.txt"
MASKED_GPU = "GPU-00000000-0000-0000-0000-000000000000"


# --- builders -------------------------------------------------------------------------

def shared(name: str) -> str:
    """The capture as nvidia-smi wrote it (CRLF line ends kept)."""
    with open(SHARED / name, encoding="utf-8", newline="") as fh:
        return fh.read()


def own(name: str) -> str:
    return (OWN / name).read_text(encoding="utf-8")


def proc(pid: int, name: str, used_mb: int | None, kind: str | None = "C") -> dict[str, Any]:
    return {"pid": pid, "name": name, "used_memory_mb": used_mb, "type": kind}


def gpu(card: int, uuid: str, klass: str, total: int, used: int, *,
        temp: float | None = None, power: float | None = None, util: float | None = None,
        processes: tuple[dict[str, Any], ...] = (), reason: str | None = None) -> Device:
    return Device(id=card, uuid=uuid, card=card, klass=klass, memory_total_mb=total,
                  memory_used_mb=used, mig=None, processes=processes, temperature_c=temp,
                  power_w=power, utilization_pct=util, healthy=reason is None,
                  reason=reason)


def mig(card: int, n: int, uuid: str, card_class: str, profile: str, total: int, used: int,
        gi: int, ci: int, *, temp: float | None = None, power: float | None = None,
        processes: tuple[dict[str, Any], ...] = (), reason: str | None = None) -> Device:
    return Device(id=placement_id(card, n), uuid=uuid, card=card,
                  klass=f"{card_class}-mig-{profile}", memory_total_mb=total,
                  memory_used_mb=used, mig=n, processes=processes, temperature_c=temp,
                  power_w=power, utilization_pct=None, healthy=reason is None,
                  reason=reason, gpu_instance=gi, compute_instance=ci, profile=profile)


def listed(index: int, name: str, uuid: str, *migs: tuple[str, str]) -> ListedGpu:
    """A -L GPU; ``migs`` are (profile, MIG uuid) in Device order."""
    return ListedGpu(index, name, uuid, tuple(ListedMig(n, profile, mig_uuid)
                                              for n, (profile, mig_uuid) in enumerate(migs)))


def masked_migs(*profiles: str) -> list[tuple[str, str]]:
    return [(p, f"MIG-0000000{n}-0000-0000-0000-00000000000{n}")
            for n, p in enumerate(profiles)]


def only_card(found: Discovery) -> Card:
    (card,) = found.cards
    return card


# --- nvidia-smi -L ----------------------------------------------------------------------

def test_new_list_form_with_padding_and_crlf_gives_profiles_and_mig_uuids() -> None:
    uuids = ["MIG-7089d0f3-293f-58c9-8f8c-5ea666eedbde", "MIG-56c30729-347f-5dd6-8da0-c3cc59e969e0",
             "MIG-9d14fb21-4ae1-546f-a636-011582899c39", "MIG-0f709664-740c-52b0-ae79-3e4c9ede6d3b"]
    assert "\r\n" in shared("h100-80gb-hbm3-mig-mixed-L.txt")
    assert parse_list(shared("h100-80gb-hbm3-mig-mixed-L.txt")) == [
        listed(0, "NVIDIA H100 80GB HBM3", "GPU-b4895dbf-9350-2524-a89b-98161ddd9fe4",
               *zip(["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], uuids, strict=True))]


def test_seven_1g_instances_list() -> None:
    (h100,) = parse_list(shared("h100-80gb-hbm3-mig-7x1g.10gb-L.txt"))
    assert [(m.index, m.profile) for m in h100.migs] == [(n, "1g.10gb") for n in range(7)]
    assert h100.migs[2].uuid == "MIG-9d14fb21-4ae1-546f-a636-011582899c39"
    assert all(m.gpu_instance is None and m.compute_instance is None for m in h100.migs)


def test_legacy_list_form_carries_gpu_and_compute_instance_in_the_uuid() -> None:
    base = "GPU-4200ccc0-2667-d4cb-9137-f932c716232a"
    (a100,) = parse_list(shared("a100-sxm4-40gb-mig-mixed-legacy-uuid-L.txt"))
    assert (a100.index, a100.name, a100.uuid) == (0, "A100-SXM4-40GB", base)
    assert a100.migs == (
        ListedMig(0, "3g.20gb", f"MIG-{base}/2/0", gpu_instance=2, compute_instance=0),
        ListedMig(1, "2g.10gb", f"MIG-{base}/3/0", gpu_instance=3, compute_instance=0),
        ListedMig(2, "1g.5gb", f"MIG-{base}/9/0", gpu_instance=9, compute_instance=0))


def test_truncated_dgx_listing_gives_two_cards_of_four_instances() -> None:
    cards = parse_list(shared("dgx-a100-80gb-8gpu-mig-balanced-L-head10.txt"))
    assert [(g.index, g.uuid) for g in cards] == [
        (0, "GPU-8e100991-ce97-6694-b8eb-b8b1ff5053af"),
        (1, "GPU-938c4705-98bf-1735-e98b-c2a5872a8022")]
    for card in cards:
        assert card.name == "NVIDIA A100-SXM4-80GB"
        assert [m.profile for m in card.migs] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert cards[1].migs[3].uuid == "MIG-91e26891-6f5b-5ff3-9c66-310e47d6b059"


def test_compute_instance_profiles_like_1c_3g_71gb_are_kept_whole() -> None:
    expected = [listed(0, "NVIDIA H200", MASKED_GPU,
                       *masked_migs("1c.3g.71gb", "2c.3g.71gb", "2g.35gb", "1g.18gb",
                                    "1g.18gb"))]
    assert parse_list(shared("h200-mig-ci-profiles-1c.3g-2c.3g-L-masked.txt")) == expected
    capture = shared("h200-mig-5-devices-2-ci-in-one-gi-drv590-capture.txt")
    assert parse_list(list_section(capture)) == expected


def test_list_sections_of_the_h100_captures() -> None:
    assert parse_list(list_section(shared(H100_CAPTURE))) == [
        listed(0, "NVIDIA H100 80GB HBM3", MASKED_GPU,
               *masked_migs("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"))]
    disabled = shared("h100-80gb-hbm3-mig-disabled-drv590-capture.txt")
    assert parse_list(list_section(disabled)) == [
        listed(0, "NVIDIA H100 80GB HBM3", MASKED_GPU)]


def test_list_skips_lines_it_does_not_understand() -> None:
    text = "No devices were found\n  MIG 1g.5gb Device 0: (UUID: MIG-x)\n"
    assert parse_list(text) == []


# --- nvidia-smi -q -x: whole GPUs ---------------------------------------------------------

def test_tesla_t4_v11_whole_gpu_with_processes() -> None:
    found = discover_from(None, shared("tesla-t4-single-datacenter-drv515.xml"))
    assert found.devices == [gpu(0, "GPU-d37e67a5-91dd-3774-a5cb-99096249601a", "t4-16g",
                                 15360, 1032, temp=40, power=26.78, util=0, processes=(
                                     proc(675, "/usr/lib/xorg/Xorg", 22, "G"),
                                     proc(5762, "python", 1005, "C")))]
    assert found.problems == [] and (found.source, found.driver_version) == (
        "nvidia-smi", "515.105.01")
    assert only_card(found) == Card(index=0, uuid="GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
                                    name="Tesla T4", klass="t4-16g")


def test_rtx_3080_v13_takes_average_power_draw() -> None:
    found = discover_from(None, shared("rtx-3080-single-consumer-drv595-schema-v13.xml"))
    assert found.devices == [gpu(0, "GPU-19d6d965-2acc-f646-00f8-4c76979aabb4",
                                 "rtx3080-10g", 10240, 9184, temp=27, power=139.62, util=65)]
    assert parse_xml(shared("rtx-3080-single-consumer-drv595-schema-v13.xml")
                     ).schema_version == 13


def test_dual_a5000_v13_gives_two_cards_in_xml_order() -> None:
    found = discover_from(None, shared("dual-rtx-a5000-multi-gpu-drv590-schema-v13.xml"))
    server = "/root/src/llama.cpp/build/bin/llama-server"
    assert found.devices == [
        gpu(0, "GPU-12345678-aaaa-bbbb-cccc-0123456789ab", "rtxa5000-24g", 24564, 22437,
            temp=13, power=6.41, util=0, processes=(proc(100477, server, 22430),)),
        gpu(1, "GPU-12345678-aaaa-bbbb-cccc-0123456789cd", "rtxa5000-24g", 24564, 17253,
            temp=15, power=13.6, util=0, processes=(proc(100477, server, 17246),))]
    assert [c.mig_current for c in found.cards] == [None, None]
    assert found.driver_version == "590.44.01" and found.problems == []


def test_windows_processes_have_no_memory_and_may_have_no_name() -> None:
    found = discover_from(None, shared("rtx-2080-windows-wddm-processes-drv516.xml"))
    (dev,) = found.devices
    assert dev == gpu(0, "GPU-fbd55ed4-1eec-4423-0a47-ad594b4333e3", "rtx2080-8g", 8192, 862,
                      temp=29, power=14.5, util=2, processes=dev.processes)
    assert len(dev.processes) == 26
    assert {p["type"] for p in dev.processes} == {"C+G"}
    assert {p["used_memory_mb"] for p in dev.processes} == {None}
    assert [p["pid"] for p in dev.processes if p["name"] == ""] == [
        10808, 12636, 13120, 22600, 25520]
    assert dev.processes[0] == proc(
        7724, "C:\\Program Files\\WindowsApps\\Microsoft.YourPhone_1.22062.543.0_x64__"
        "8wekyb3d8bbwe\\PhoneExperienceHost.exe", None, "C+G")


def test_throttle_and_event_reason_elements_are_both_read() -> None:
    v11 = parse_xml(own("a100-sxm4-40gb-legacy-mig-v11.xml")).gpus[0]
    v12 = parse_xml(own("a100-sxm4-80gb-mig-pending-v12.xml")).gpus[0]
    dual = parse_xml(shared("dual-rtx-a5000-multi-gpu-drv590-schema-v13.xml")).gpus
    assert v11.clock_reasons_active == ("sw_power_cap",)
    assert v12.clock_reasons_active == ("gpu_idle",)
    assert [g.clock_reasons_active for g in dual] == [("gpu_idle",), ("gpu_idle",)]


def test_stray_newline_inside_a_value_is_ignored() -> None:
    (a100,) = parse_xml(shared("a100-sxm4-40gb-mig-enabled-2-instances-drv510.xml")).gpus
    assert a100.clock_reasons_active == ()
    assert (a100.product_name, a100.power_w, a100.temperature_c) == (
        "NVIDIA A100-SXM4-40GB", 66.92, 36)


def test_absent_values_are_none_never_zero() -> None:
    found = discover_from(None, own("l4-absent-values-v13.xml"))
    # used [N/A] falls back to total - free; power falls back to instant_power_draw
    assert found.devices == [gpu(0, "GPU-1a4a4a4a-0000-1111-2222-333333333333", "l4-24g",
                                 23034, 3034, temp=None, power=35.5, util=None,
                                 processes=(proc(777, "/usr/bin/llama-server", None),))]
    (l4,) = parse_xml(own("l4-absent-values-v13.xml")).gpus
    assert (l4.mig_current, l4.mig_pending) == (None, None)
    assert l4.health.uncorrectable_ecc_volatile is None
    assert l4.health.retired_pages_pending is None and l4.health.remap_pending is None


# --- MIG ----------------------------------------------------------------------------------

def test_a100_80gb_mig_without_list_output_derives_nothing_and_says_why() -> None:
    found = discover_from(None, shared("a100-sxm4-80gb-mig-enabled-4-instances-drv535.xml"))
    assert found.devices == []
    card = only_card(found)
    assert (card.klass, card.mig_current, card.mig_pending, card.instances) == (
        "a100-80g", True, True, 4)
    assert card.problem and "nvidia-smi -L" in card.problem
    assert found.problems == [f"card 0 (NVIDIA A100-SXM4-80GB): {card.problem}; {card.hint}"]


def test_a100_80gb_mig_v12_joined_with_list_by_index() -> None:
    found = discover_from(own("a100-sxm4-80gb-mig-4x1g.20gb-L.txt"),
                          shared("a100-sxm4-80gb-mig-enabled-4-instances-drv535.xml"))
    assert found.problems == []
    assert found.devices == [
        mig(0, n, A100_80GB_MIG_UUIDS[n], "a100-80g", "1g.20gb",
            19968, 12, gi=n + 3, ci=0, temp=27, power=67.03) for n in range(4)]
    assert [d.id for d in found.devices] == [1000, 1001, 1002, 1003]
    assert only_card(found).instances == 4 and only_card(found).problem is None


def test_h100_new_list_joined_by_index_gives_each_instance_its_processes() -> None:
    found = discover_from(list_section(shared(H100_CAPTURE)),
                          own("h100-80gb-hbm3-mig-4-instances-v13.xml"))
    hogs = (proc(21180, "/root/tools/memhog", 2296), proc(21181, "/root/tools/memhog", 1272),
            proc(21198, "./gpu_burn", 7484))
    card: dict[str, Any] = dict(card_class="h100-80g", temp=53.0, power=432.21)
    uuids = [u for _, u in masked_migs("", "", "", "")]
    assert found.devices == [
        mig(0, 0, uuids[0], profile="3g.40gb", total=40448, used=11091, gi=2, ci=0,
            processes=hogs, **card),
        mig(0, 1, uuids[1], profile="2g.20gb", total=20096, used=17, gi=3, ci=0, **card),
        mig(0, 2, uuids[2], profile="1g.10gb", total=9984, used=9, gi=9, ci=0, **card),
        mig(0, 3, uuids[3], profile="1g.10gb", total=9984, used=9, gi=10, ci=0, **card)]
    assert [d.label for d in found.devices] == ["0/mig0", "0/mig1", "0/mig2", "0/mig3"]
    assert found.problems == [] and found.driver_version == "590.48.01"


def test_legacy_list_is_joined_by_gpu_and_compute_instance_not_by_index() -> None:
    base = "GPU-4200ccc0-2667-d4cb-9137-f932c716232a"
    found = discover_from(shared("a100-sxm4-40gb-mig-mixed-legacy-uuid-L.txt"),
                          own("a100-sxm4-40gb-legacy-mig-v11.xml"))
    card: dict[str, Any] = dict(card_class="a100-40g", temp=41.0, power=88.4)
    assert found.devices == [
        mig(0, 0, f"MIG-{base}/2/0", profile="3g.20gb", total=19968, used=5011, gi=2, ci=0,
            processes=(proc(4343, "python3", 5000),), **card),
        mig(0, 1, f"MIG-{base}/3/0", profile="2g.10gb", total=9856, used=7, gi=3, ci=0,
            **card),
        mig(0, 2, f"MIG-{base}/9/0", profile="1g.5gb", total=4864, used=3, gi=9, ci=0,
            **card)]
    assert only_card(found).name == "A100-SXM4-40GB" and found.problems == []


def test_mig_device_missing_from_the_list_is_left_out_with_a_problem() -> None:
    text = list_section(shared(H100_CAPTURE))
    lines = [line for line in text.splitlines() if "Device  3:" not in line]
    lines.append("  MIG 1g.10gb     Device  7: (UUID: MIG-00000007-0000-0000-0000-0000000000"
                 "07)")
    found = discover_from("\n".join(lines), own("h100-80gb-hbm3-mig-4-instances-v13.xml"))
    assert [d.label for d in found.devices] == ["0/mig0", "0/mig1", "0/mig2"]
    assert len(found.problems) == 2
    assert "MIG device 3 (GPU instance 10, compute instance 0) is not in" in found.problems[0]
    assert "lists MIG Device 7" in found.problems[1]


def test_list_without_this_card_leaves_its_mig_devices_out() -> None:
    found = discover_from(shared("h100-80gb-hbm3-mig-mixed-L.txt"),
                          own("h100-80gb-hbm3-mig-4-instances-v13.xml"))
    assert found.devices == []
    assert f"does not list this card ({MASKED_GPU})" in (only_card(found).problem or "")


def test_mig_enabled_with_nothing_carved_runs_nothing_and_says_how_to_carve() -> None:
    found = discover_from(own("h100-80gb-hbm3-mig-nothing-carved-L.txt"),
                          own("h100-80gb-hbm3-mig-nothing-carved-v13.xml"))
    assert found.devices == []
    card = only_card(found)
    assert (card.klass, card.mig_current, card.mig_pending, card.instances) == (
        "h100-80g", True, True, 0)
    assert card.problem == "MIG is enabled but no MIG instance is created"
    assert card.hint is not None and "`nvidia-smi mig -i 0 -cgi 1g.10gb,1g.10gb -C`" in card.hint
    assert found.problems == [f"card 0 (NVIDIA H100 80GB HBM3): {card.problem}; {card.hint}"]


def test_pending_mig_change_runs_nothing_until_reset() -> None:
    found = discover_from(own("a100-sxm4-80gb-mig-pending-L.txt"),
                          own("a100-sxm4-80gb-mig-pending-v12.xml"))
    assert found.devices == []
    card = only_card(found)
    assert (card.mig_current, card.mig_pending) == (False, True)
    assert card.problem == "a MIG mode change is pending (MIG is disabled, will be enabled)"
    assert card.hint == ("reset the GPU (`nvidia-smi -i 0 -r`) or reboot to apply the pending "
                         "MIG mode")
    assert found.problems[0].startswith("card 0 (NVIDIA A100-SXM4-80GB): a MIG mode change")
    assert parse_xml(own("a100-sxm4-80gb-mig-pending-v12.xml")).gpus[0].power_w == 61.25


# --- health -------------------------------------------------------------------------------

def test_unhealthy_cards_are_reported_and_mig_devices_inherit_the_card_health() -> None:
    found = discover_from(own("unhealthy-v100-and-a100-mig-L.txt"),
                          own("unhealthy-v100-and-a100-mig-v12.xml"))
    v100_reason = ("retired pages are pending: reset the GPU (nvidia-smi -r) or reboot; "
                   "3 uncorrectable ECC errors since the last reset: reset the GPU and "
                   "watch for more")
    a100_reason = ("row remapping failed: the card needs service; a row remap is pending: "
                   "reset the GPU (nvidia-smi -r) or reboot")
    assert found.devices == [
        gpu(0, "GPU-5eed0000-aaaa-bbbb-cccc-000000000006", "v100-32g", 32768, 0, temp=38,
            power=43.1, util=0, reason=v100_reason),
        mig(1, 0, "MIG-5eed0000-7777-5000-8000-000000000000", "a100-80g", "7g.80gb", 80896,
            13, gi=0, ci=0, temp=33, power=58.0, reason=a100_reason)]
    assert [c.problem for c in found.cards] == [None, None]
    assert found.problems == []


def test_healthy_fixtures_stay_healthy() -> None:
    for name in ("tesla-t4-single-datacenter-drv515.xml",
                 "dual-rtx-a5000-multi-gpu-drv590-schema-v13.xml"):
        assert all(d.healthy and d.reason is None
                   for d in discover_from(None, shared(name)).devices)


# --- runners and the source ---------------------------------------------------------------

class BrokenRunner(NvidiaSmiRunner):
    def list_gpus(self) -> str:
        raise NvidiaSmiError("`nvidia-smi -L` failed")

    def query_xml(self) -> str:
        return shared("tesla-t4-single-datacenter-drv515.xml")


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!{sys.executable}\nimport sys, time\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_file_runner_feeds_the_source() -> None:
    source = NvidiaSmiSource(FileRunner(SHARED / "a100-sxm4-40gb-mig-mixed-legacy-uuid-L.txt",
                                        OWN / "a100-sxm4-40gb-legacy-mig-v11.xml"))
    found = source.discover()
    assert [d.id for d in found.devices] == [1000, 1001, 1002]
    assert found.source == "nvidia-smi" and found.driver_version == "460.73.01"


def test_runner_failure_gives_no_devices_and_one_problem() -> None:
    found = NvidiaSmiSource(BrokenRunner()).discover()
    assert (found.devices, found.cards) == ([], [])
    assert found.problems == ["nvidia-smi: `nvidia-smi -L` failed"]


def test_missing_captured_file_is_a_problem(tmp_path: Path) -> None:
    found = NvidiaSmiSource(FileRunner(tmp_path / "L.txt", tmp_path / "q.xml")).discover()
    assert found.devices == [] and "cannot read it" in found.problems[0]


def test_missing_binary_says_to_install_the_driver(tmp_path: Path) -> None:
    found = NvidiaSmiSource(SubprocessRunner(str(tmp_path / "nvidia-smi"))).discover()
    assert found.devices == []
    (problem,) = found.problems
    assert "is not installed or not on PATH" in problem and "install the NVIDIA driver" in problem


def test_failing_binary_reports_exit_status_and_its_message(tmp_path: Path) -> None:
    binary = script(tmp_path, "print(\"NVIDIA-SMI has failed because it couldn't communicate "
                              "with the NVIDIA driver.\")\nsys.exit(9)")
    (problem,) = NvidiaSmiSource(SubprocessRunner(binary)).discover().problems
    assert "failed with exit status 9: NVIDIA-SMI has failed" in problem
    assert "install the NVIDIA driver" in problem


def test_hung_binary_times_out(tmp_path: Path) -> None:
    binary = script(tmp_path, "time.sleep(5)")
    (problem,) = NvidiaSmiSource(SubprocessRunner(binary, timeout=0.3)).discover().problems
    assert "did not answer within 0.3 s" in problem


def test_subprocess_runner_passes_the_right_arguments(tmp_path: Path) -> None:
    list_file = SHARED / "tesla-t4-single-datacenter-drv515.xml"
    binary = script(tmp_path, f"""
if sys.argv[1:] == ["-L"]:
    print("GPU 0: Tesla T4 (UUID: GPU-d37e67a5-91dd-3774-a5cb-99096249601a)")
elif sys.argv[1:] == ["-q", "-x"]:
    sys.stdout.write(open({str(list_file)!r}).read())
else:
    sys.exit(2)""")
    found = NvidiaSmiSource(SubprocessRunner(binary)).discover()
    assert [d.klass for d in found.devices] == ["t4-16g"] and found.problems == []


def test_output_that_is_not_xml_is_a_problem() -> None:
    found = discover_from("", "NVIDIA-SMI has failed because it couldn't communicate")
    assert found.devices == [] and "is not XML" in found.problems[0]
    found = discover_from("", "<other/>")
    assert "not <nvidia_smi_log>" in found.problems[0]


def test_a_repeated_problem_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    source = NvidiaSmiSource(BrokenRunner())
    with caplog.at_level(logging.WARNING, logger="llmgw_runtime.devices.nvidia_smi"):
        source.discover()
        source.discover()
    assert len(caplog.records) == 1


def test_spec_nvidia_smi_gives_the_source() -> None:
    assert isinstance(source_from_spec("nvidia-smi"), NvidiaSmiSource)
