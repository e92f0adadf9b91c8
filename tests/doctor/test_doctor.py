"""`llmgw doctor`: findings and exit codes for each state a node can be in, with the fake
NVML (real NVML's interface) and the real library on this GPU-less machine."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmgw_runtime.agent.config import AgentConfig
from llmgw_runtime.cli.main import cli
from llmgw_runtime.cli.up import write_agent_env
from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.devices import fake_nvml
from llmgw_runtime.devices.nvml import NvmlSource
from llmgw_runtime.devices.sources import NullSource
from llmgw_runtime.doctor.diagnose import ERROR, OK, WARNING, diagnose, exit_code
from llmgw_runtime.doctor.gather import gather
from llmgw_runtime.doctor.local import find
from llmgw_runtime.store import Store
from tests.control.conftest import ADMIN, JOIN, ROUTER, served


def config(**over: object) -> AgentConfig:
    base: dict[str, object] = {"control_url": "http://127.0.0.1:1", "join_token": JOIN,
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


@pytest.fixture(autouse=True)
def no_local_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test's own `llmgw up` state directory (empty unless the test writes one)."""
    state = tmp_path / "up-state"
    state.mkdir()
    monkeypatch.setenv("LLMGW_STATE_DIR", str(state))
    for key in ("LLMGW_DEVICES", "LLMGW_CONTROL_URL", "LLMGW_WEIGHTS_DIRS", "LLMGW_CA_FILE"):
        monkeypatch.delenv(key, raising=False)
    return state


def doctor_json(*args: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    result = CliRunner().invoke(cli, ["doctor", *args, "-o", "json"])
    return result.exit_code, json.loads(result.output)


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


@pytest.fixture
def control_url(tmp_path: Path) -> Iterator[str]:
    """A real control service (SQLite) on a loopback port, stopped by the test."""
    config = ControlConfig(state_dir=tmp_path / "control", admin_token=ADMIN, join_token=JOIN,
                           router_token=ROUTER)
    store = Store(f"sqlite:///{tmp_path}/llmgw.db")
    store.migrate()
    bootstrap(store, config)
    try:
        with served(create_app(config, store_=store)) as url:
            yield url
    finally:
        store.dispose()


def test_on_the_machine_of_llmgw_up_it_checks_the_cpu_agent_up_runs_and_passes(
        no_local_agent: Path, control_url: str) -> None:
    """`make up` then `llmgw doctor` in the same directory: the doctor reads the settings
    `up` started its agent with (the CPU, up's control service), not GPU discovery."""
    written = write_agent_env(no_local_agent, control_url)
    assert written["LLMGW_DEVICES"] == "cpu"
    assert (no_local_agent / "agent.env").stat().st_mode & 0o077 == 0
    code, report = doctor_json()
    # The router's relay loop is a warning where pip had no compiler (test_doctor_relay.py).
    relay_ok = all(f["level"] == OK for f in report["findings"] if f["topic"] == "router")
    assert code == (0 if relay_ok else 1), report["findings"]
    assert report["devices"] == "cpu" and report["nvml"] is None
    first = report["findings"][0]
    assert first["topic"] == "settings" and str(no_local_agent / "agent.env") in first["message"]
    assert "llmgw up" in first["message"]
    assert any(f["level"] == OK and f["message"].startswith("device source cpu: 1 device(s)")
               for f in report["findings"])
    assert report["control"] == {"url": control_url, "ok": True, "detail": "ok"}
    # an option still wins over the file
    code, report = doctor_json("--devices", "none")
    assert code == 2 and report["devices"] == "none"


def test_an_installed_agent_s_env_file_is_what_is_checked(tmp_path: Path) -> None:
    """The Ansible role's /etc/llmgw/agent.env, given with --env-file: its LLMGW_DEVICES,
    its control URL and its weights directories are the ones checked."""
    devices = tmp_path / "devices.yaml"
    devices.write_text("devices:\n  - {uuid: GPU-1, class: h100-80g, memory_total_mb: 81559}\n")
    env = tmp_path / "agent.env"
    env.write_text(f"# Managed by Ansible\nLLMGW_CONTROL_URL=http://127.0.0.1:1\n"
                   f"LLMGW_JOIN_TOKEN=llmgw-join-secret-0123456789abcdef\nLLMGW_DEVICES=fake:{devices}\n"
                   f"LLMGW_WEIGHTS_DIRS={tmp_path / 'no-such-dir'}\nLLMGW_CA_FILE=\n")
    code, report = doctor_json("--env-file", str(env))
    assert code == 2                                     # the control service is not there
    assert report["devices"] == f"fake:{devices}"
    messages = [f["message"] for f in report["findings"]]
    assert any("device source fake:" in m and "1 device(s) (h100-80g)" in m for m in messages)
    assert any(str(tmp_path / "no-such-dir") in m for m in messages)
    assert report["control"]["url"] == "http://127.0.0.1:1"
    assert "llmgw-join-secret" not in json.dumps(report)


def test_a_fake_devices_file_that_does_not_exist_fails_naming_the_path() -> None:
    code, report = doctor_json("--devices", "fake:/nonexistent/devices.yaml",
                               "--control-url", "http://127.0.0.1:1")
    assert code == 2
    [bad] = [f for f in report["findings"] if f["topic"] == "devices"]
    assert bad["level"] == ERROR and "/nonexistent/devices.yaml" in bad["message"]
    assert "cannot read it" in bad["message"] and "fake:" in bad["fix"]


@pytest.mark.parametrize("spec", ["none", "fake:EMPTY"])
def test_no_device_at_all_is_exit_code_2(spec: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("devices: []\n")
    code, report = doctor_json("--devices", spec.replace("EMPTY", str(empty)),
                               "--control-url", "http://127.0.0.1:1")
    assert code == 2
    [bad] = [f for f in report["findings"] if f["topic"] == "devices"]
    assert bad["level"] == ERROR and "found no device: this node can run no model" in \
        bad["message"]


def test_an_unknown_devices_value_says_what_devices_accepts(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["doctor", "--devices", "bogus"])
    assert result.exit_code == 2
    assert "'bogus' is not a device source; use one of auto, nvml, nvidia-smi, cpu, none, " \
           "fake:FILE" in result.output
    assert "AgentConfig" not in result.output
    # the same value from the agent's env file: a finding naming the file, no class name
    env = tmp_path / "agent.env"
    env.write_text("LLMGW_DEVICES=bogus\n")
    code, report = doctor_json("--env-file", str(env))
    assert code == 2
    text = json.dumps(report)
    assert "AgentConfig" not in text and "devices 'bogus' is unknown; use auto" in text
    assert str(env) in report["findings"][-1]["fix"]


def test_the_up_state_dir_comes_before_the_installed_file_and_unreadable_is_said(
        tmp_path: Path) -> None:
    up_state, installed = tmp_path / "up", tmp_path / "etc-agent.env"
    up_state.mkdir()
    assert find(None, up_state, installed).path is None
    (up_state / "agent").mkdir()            # an `up` from before it wrote agent.env
    assert "start `llmgw up` again, or pass --devices cpu" in find(
        None, up_state, installed).describe()
    installed.write_text("LLMGW_DEVICES=auto\n")
    assert find(None, up_state, installed).values == {"LLMGW_DEVICES": "auto"}
    (up_state / "agent.env").write_text("LLMGW_DEVICES=cpu\n")
    found = find(None, up_state, installed)
    assert found.path == up_state / "agent.env" and found.values["LLMGW_DEVICES"] == "cpu"
    (up_state / "agent.env").unlink()
    (up_state / "agent.env").mkdir()                  # unreadable, even for root
    found = find(None, up_state, installed)
    assert found.problem and str(up_state / "agent.env") in found.problem
    assert "could not be read" in found.describe()
