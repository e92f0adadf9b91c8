"""`llmgw doctor`: findings and exit codes for each state a node can be in, with the fake
NVML (real NVML's interface) and the real library on this GPU-less machine."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw_runtime.agent.config import AgentConfig
from llmgw_runtime.cli.main import cli
from llmgw_runtime.devices import fake_nvml
from llmgw_runtime.devices.nvml import NvmlSource
from llmgw_runtime.devices.sources import NullSource
from llmgw_runtime.doctor.diagnose import ERROR, OK, WARNING, diagnose, exit_code
from llmgw_runtime.doctor.gather import gather


def config(**over: object) -> AgentConfig:
    base: dict[str, object] = {"control_url": "http://127.0.0.1:1", "join_token": "x",
                               "devices": "nvml"}
    base.update(over)
    return AgentConfig(**base)  # type: ignore[arg-type]


def findings_for(scenario: Callable[[], fake_nvml.FakeNvml], **over: object) -> list:  # type: ignore[type-arg]
    facts = gather(config(**over), nvml=NvmlSource(scenario()), check_control=False)
    return diagnose(facts)


def levels(findings: list, topic: str) -> list[str]:  # type: ignore[type-arg]
    return [f.level for f in findings if f.topic == topic]


def test_a_healthy_mig_card_is_all_good() -> None:
    found = findings_for(fake_nvml.a100_80gb_4_instances)
    mig = [f for f in found if f.topic == "mig"]
    assert [f.level for f in mig] == [OK]
    assert "MIG enabled, 4 instance(s)" in mig[0].message
    assert levels(found, "driver") == [OK]
    assert "driver 535.54.03" in found[0].message


def test_mig_disabled_card_is_a_whole_gpu() -> None:
    found = findings_for(fake_nvml.h100_mig_disabled)
    [mig] = [f for f in found if f.topic == "mig"]
    assert mig.level == OK and "MIG disabled" in mig.message and "h100-80g" in mig.message


def test_nothing_carved_warns_and_says_how_to_carve_then_errors_for_the_node() -> None:
    found = findings_for(fake_nvml.mig_enabled_nothing_carved)
    [warn] = [f for f in found if f.topic == "mig"]
    assert warn.level == WARNING and "can run nothing" in warn.message
    assert "nvidia-smi mig -i 0 -cgi" in (warn.fix or "")
    assert levels(found, "devices") == [ERROR]
    assert exit_code(found) == 2


def test_pending_mig_change_says_to_reset_or_reboot() -> None:
    found = findings_for(fake_nvml.mig_change_pending)
    [warn] = [f for f in found if f.topic == "mig"]
    assert warn.level == WARNING and "pending" in warn.message.lower()
    assert "-r" in (warn.fix or "") and "reboot" in (warn.fix or "")
    assert exit_code(found) == 2


def test_no_driver_is_an_error_that_says_to_install_it() -> None:
    facts = gather(config(), nvml=NvmlSource(fake_nvml.no_driver()), check_control=False)
    found = diagnose(facts)
    assert any(f.level == ERROR and "no NVIDIA driver" in f.message for f in found)
    assert exit_code(found) == 2


def test_an_unhealthy_card_is_a_warning_with_its_reason() -> None:
    found = findings_for(fake_nvml.unhealthy_card)
    [health] = [f for f in found if f.topic == "health"]
    assert health.level == WARNING and "retired pages" in health.message


def test_nvml_and_nvidia_smi_disagreeing_is_a_warning() -> None:
    class Other(NullSource):
        name = "nvidia-smi"

        def discover(self):  # type: ignore[no-untyped-def]
            found = NvmlSource(fake_nvml.h100_mig_disabled()).discover()
            return found

    facts = gather(config(devices="auto"), nvml=NvmlSource(fake_nvml.a100_80gb_4_instances()),
                   nvidia_smi=Other(), check_control=False)
    [warn] = [f for f in diagnose(facts) if "disagree" in f.message]
    assert warn.level == WARNING and fake_nvml.H100_UUID in warn.message


def test_weights_directories_missing_or_empty_are_warnings(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "m.gguf").write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    found = findings_for(fake_nvml.a100_80gb_4_instances,
                         weights_dirs=(str(full), str(tmp_path / "empty"),
                                       str(tmp_path / "missing")))
    weights = {f.message.split(" ")[2]: f.level for f in found if f.topic == "weights"}
    assert weights == {str(full): OK, str(tmp_path / "empty"): WARNING,
                       str(tmp_path / "missing"): WARNING}
    assert exit_code(found) == 1


def test_a_missing_llama_server_binary_is_an_error() -> None:
    found = findings_for(fake_nvml.a100_80gb_4_instances,
                         llama_server_binary="/nonexistent/llama-server")
    assert levels(found, "engines")[0] == ERROR


@pytest.mark.parametrize("args,code", [(["--devices", "cpu"], 2), ([], 2)])
def test_the_real_command_on_this_machine(args: list[str], code: int) -> None:
    """No GPU and no control service here: the real NVML library and nvidia-smi fail,
    and the doctor says so with exit code 2 and valid JSON."""
    result = CliRunner().invoke(cli, ["doctor", "--control-url", "http://127.0.0.1:1",
                                      *args, "-o", "json"])
    assert result.exit_code == code
    report = json.loads(result.output)
    assert report["exit_code"] == code
    assert any(f["topic"] == "control" and f["level"] == ERROR for f in report["findings"])
    if not args:
        assert report["nvml"]["devices"] == [] and report["nvml"]["problems"]
        assert any("no NVIDIA driver" in f["message"] for f in report["findings"])


def test_table_output_says_what_to_do() -> None:
    result = CliRunner().invoke(cli, ["doctor", "--devices", "cpu", "--control-url",
                                      "http://127.0.0.1:1"])
    assert result.exit_code == 2
    assert "FAIL [control]" in result.output and "what to do:" in result.output
    assert result.output.strip().endswith("errors: this node cannot serve until they are fixed")
