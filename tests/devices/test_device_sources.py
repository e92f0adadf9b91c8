import json
import socket
from pathlib import Path

import pytest

from llmgw_runtime.devices import (
    CpuSource,
    Device,
    FakeSource,
    NullSource,
    source_from_spec,
)
from llmgw_runtime.errors import DeviceError
from llmgw_runtime.fleetvocab import placement_id

API_KEYS = {"id", "uuid", "card", "mig", "class", "memory_total_mb", "memory_used_mb",
            "processes", "temperature_c", "power_w", "utilization_pct", "healthy", "reason",
            "gpu_instance", "compute_instance", "profile"}


def test_cpu_source_reports_one_cpu_device_with_memory_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       8192000 kB\nMemFree:  100 kB\n"
                       "MemAvailable:   6144000 kB\n")
    found = CpuSource(meminfo, hostname="box").discover()
    assert found.problems == []
    (dev,) = found.devices
    assert dev.to_dict() == {
        "id": 0, "uuid": "cpu-box", "card": 0, "mig": None, "class": "cpu",
        "memory_total_mb": 8000, "memory_used_mb": 2000, "processes": [],
        "temperature_c": None, "power_w": None, "utilization_pct": None,
        "healthy": True, "reason": None, "gpu_instance": None, "compute_instance": None,
        "profile": None}


def test_cpu_source_on_this_host_uses_the_hostname() -> None:
    (dev,) = source_from_spec("cpu").discover().devices
    assert dev.uuid == f"cpu-{socket.gethostname()}"
    assert dev.memory_total_mb > 0 and 0 <= dev.memory_used_mb <= dev.memory_total_mb


def test_null_source_has_no_devices() -> None:
    assert NullSource().discover().devices == []
    assert isinstance(source_from_spec("none"), NullSource)


def test_fake_yaml_file_fills_defaults_and_computes_mig_ids(tmp_path: Path) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text(
        "devices:\n"
        "  - {uuid: GPU-aaa, class: a100-80g, memory_total_mb: 81920, temperature_c: 40}\n"
        "  - {uuid: MIG-bbb, class: a100-80g-mig-3g.40gb, card: 1, mig: 2,\n"
        "     memory_total_mb: 40000, healthy: false, reason: ECC errors}\n"
        "problems: ['card 3: driver too old, can run nothing']\n")
    found = source_from_spec(f"fake:{path}").discover()
    gpu, mig = found.devices
    assert (gpu.id, gpu.card, gpu.mig, gpu.label) == (0, 0, None, "0")
    assert gpu.utilization_pct is None and gpu.temperature_c == 40
    assert (mig.id, mig.label) == (placement_id(1, 2), "1/mig2") == (1102, "1/mig2")
    assert mig.healthy is False and mig.reason == "ECC errors"
    assert found.problems == ["card 3: driver too old, can run nothing"]
    assert set(gpu.to_dict()) == API_KEYS


def test_fake_json_file_round_trips_through_from_dict(tmp_path: Path) -> None:
    dev = Device(id=3, uuid="GPU-x", card=3, klass="h100-80g", memory_total_mb=81559,
                 memory_used_mb=10, processes=({"pid": 7, "used_mb": 10},), power_w=300.5)
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"devices": [dev.to_dict()]}))
    (back,) = FakeSource(path).discover().devices
    assert back == dev == Device.from_dict(dev.to_dict())


def test_bad_fake_file_names_the_file_and_every_bad_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("devices:\n  - {uuid: GPU-a, class: a100-80g, memory_total_mb: lots}\n"
                    "  - {class: '', memory_total_mb: 1, healthy: maybe}\n")
    with pytest.raises(DeviceError) as err:
        FakeSource(path).discover()
    text = str(err.value)
    assert str(path) in text
    assert "devices[0].memory_total_mb: 'lots' is not an integer" in text
    assert "devices[1].uuid: missing" in text
    assert "devices[1].class" in text and "devices[1].healthy" in text


@pytest.mark.parametrize("content, expected", [
    ("devices: {not: a list}", "field 'devices' is missing or not a list"),
    ("devices: [\n", "not valid YAML"),
])
def test_fake_file_with_wrong_shape_says_what_to_write(tmp_path: Path, content: str,
                                                       expected: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(content)
    with pytest.raises(DeviceError, match=expected) as err:
        FakeSource(path).discover()
    assert str(path) in str(err.value)


def test_missing_fake_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DeviceError, match="cannot read it"):
        source_from_spec(f"fake:{tmp_path}/nope.yaml").discover()


def test_from_dict_is_strict_about_fields() -> None:
    with pytest.raises(DeviceError) as err:
        Device.from_dict({"uuid": "u", "class": "cpu", "memory_total_mb": 1})
    assert "device.id: missing" in str(err.value)


@pytest.mark.parametrize("spec", ["nvml-ish", "fake:", "cpu:extra"])
def test_unknown_or_malformed_spec_is_refused(spec: str) -> None:
    with pytest.raises(DeviceError):
        source_from_spec(spec)
