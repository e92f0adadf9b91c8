"""Config validation and the parts of the loop that need no control service."""

import logging
import threading
from pathlib import Path

import pytest

from llmgw_runtime.agent import Agent, AgentConfig, load_config, run
from llmgw_runtime.agent.procs import free_port
from llmgw_runtime.errors import ConfigError


def config(tmp_path: Path, **over: object) -> AgentConfig:
    values: dict[str, object] = {
        "control_url": f"http://127.0.0.1:{free_port()}", "join_token": "llmgw-join-secret-0123456789abcdef",
        "node_name": "node-a", "state_dir": tmp_path / "state", "devices": "cpu",
        "report_interval_s": 0.05}
    values.update(over)
    return AgentConfig(**values)  # type: ignore[arg-type]


def test_missing_control_url_and_join_token_are_reported_together() -> None:
    with pytest.raises(ConfigError) as err:
        load_config()
    text = str(err.value)
    assert "control_url is required" in text and "join_token is required" in text


def test_config_comes_from_llmgw_environment(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setenv("LLMGW_CONTROL_URL", "http://127.0.0.1:8470")
    monkeypatch.setenv("LLMGW_JOIN_TOKEN", "llmgw-join-abc-0123456789abcdef")
    monkeypatch.setenv("LLMGW_WEIGHTS_DIRS", "/a, /b")
    monkeypatch.setenv("LLMGW_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("LLMGW_STOP_ENGINES_ON_EXIT", "true")
    cfg = load_config(devices="none")
    assert cfg.weights_dirs == ("/a", "/b") and cfg.state_dir == tmp_path
    assert cfg.stop_engines_on_exit is True and cfg.devices == "none"
    assert cfg.run_dir == tmp_path / "run"
    assert "llmgw-join-abc-0123456789abcdef" not in repr(cfg)


def test_bad_values_are_each_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(control_url="ftp://x", join_token="t", devices="gpu-magic",
                    report_interval_s=-1.0)
    text = str(err.value)
    assert "ftp://x" in text and "gpu-magic" in text and "report_interval_s" in text


def test_report_has_the_documented_shape(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    agent = Agent.from_config(config(tmp_path, weights_dirs=(str(weights),), fabric="ib0"))
    report = agent.build_report().to_json()
    assert report["node"] == "node-a" and report["fabric"] == "ib0"
    assert report["engines"] == ["llama.cpp"]
    assert report["devices"][0]["class"] == "cpu"
    assert [d["path"] for d in report["weights"]["dirs"]] == [str(weights)]
    assert report["weights"]["sources"] == {} and report["sources_hash"] == ""
    assert report["replicas"] == []


def test_an_agent_told_no_weights_dirs_reports_no_weights(tmp_path: Path) -> None:
    report = Agent.from_config(config(tmp_path)).build_report().to_json()
    assert report["weights"] == {} and "sources_hash" not in report


def test_the_agent_reports_the_catalog_sources_it_holds(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    (weights / "Org" / "Repo").mkdir(parents=True)
    (weights / "Org" / "Repo" / "m.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    agent = Agent.from_config(config(tmp_path, weights_dirs=(str(weights),)))
    agent.sources = ["hf://Org/Repo/m.gguf", "hf://Org/Other/x.gguf"]
    held = agent.build_report().to_json()["weights"]["sources"]
    assert list(held) == ["hf://Org/Repo/m.gguf"]
    assert held["hf://Org/Repo/m.gguf"]["path"] == str(weights / "Org" / "Repo" / "m.gguf")


def test_a_cycle_against_an_unreachable_control_logs_and_keeps_going(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent = Agent.from_config(config(tmp_path))
    with caplog.at_level(logging.WARNING):
        assert agent.run_cycle() == pytest.approx(0.05)
        assert agent.run_cycle() == pytest.approx(0.05)
    assert "control service at http" in caplog.text and "is unreachable" in caplog.text
    assert "llmgw-join-secret" not in caplog.text


def test_run_returns_when_stopped(tmp_path: Path) -> None:
    stop = threading.Event()
    timer = threading.Timer(0.3, stop.set)
    timer.start()
    assert run(config(tmp_path), stop=stop) == 0
    assert (tmp_path / "state" / "run").is_dir()
