"""Typed configuration: environment overrides with the LLMGW_ prefix, every error at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw_runtime import settings
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.errors import ConfigError


def test_environment_overrides_defaults_and_flags_win() -> None:
    env = {"LLMGW_PORT": "9000", "LLMGW_WORKERS": "3", "LLMGW_STATE_DIR": "/tmp/x"}
    cfg = settings.load(ControlConfig, env=env, workers=5)
    assert (cfg.port, cfg.workers, cfg.state_dir) == (9000, 5, Path("/tmp/x"))
    assert cfg.store_url == "sqlite:////tmp/x/llmgw.db"


def test_every_bad_value_is_reported_at_once() -> None:
    env = {"LLMGW_PORT": "eighty", "LLMGW_RECONCILE": "maybe", "LLMGW_LEASE_TTL_S": "x"}
    with pytest.raises(ConfigError) as info:
        settings.load(ControlConfig, env=env)
    text = str(info.value)
    assert "LLMGW_PORT='eighty' is not an integer" in text
    assert "LLMGW_RECONCILE='maybe' is not a boolean" in text
    assert "LLMGW_LEASE_TTL_S='x' is not a number" in text


def test_cross_field_rules_are_checked() -> None:
    with pytest.raises(ConfigError) as info:
        settings.load(ControlConfig, env={"LLMGW_PORT": "0", "LLMGW_LEASE_TTL_S": "1",
                                          "LLMGW_DATABASE_URL": "mysql://x"})
    assert len(info.value.details) == 3


def test_a_web_nice_out_of_range_names_the_range() -> None:
    for bad in ("-1", "20"):
        with pytest.raises(ConfigError) as info:
            settings.load(ControlConfig, env={"LLMGW_WEB_NICE": bad})
        assert info.value.details == [f"LLMGW_WEB_NICE={bad} must be a nice value from 0 "
                                      "(the reconciler's priority) to 19"]
    assert settings.load(ControlConfig, env={"LLMGW_WEB_NICE": "0"}).web_nice == 0


def test_unprefixed_variables_are_ignored() -> None:
    assert settings.load(ControlConfig, env={"PORT": "1"}).port == 8470


@pytest.mark.parametrize("argv, env, says", [
    (["agent", "--devices", "bogus"],
     {"LLMGW_CONTROL_URL": "http://127.0.0.1:9",
      "LLMGW_JOIN_TOKEN": "llmgw-join-test-0123456789abcdef"},
     "Error: the agent's settings are not valid\n  - devices 'bogus' is unknown; use auto, "),
    (["server", "migrate"], {"LLMGW_PORT": "x"},
     "Error: the control service's settings are not valid\n  - LLMGW_PORT='x' is not an "
     "integer"),
    (["router", "--control-url", "http://127.0.0.1:9"], {"LLMGW_ROUTER_TOKEN": ""},
     "Error: the router's settings are not valid\n  - router_token is required"),
])
def test_bad_settings_name_the_program_not_a_class(argv: list[str], env: dict[str, str],
                                                    says: str, tmp_path: Path) -> None:
    """Issue 15: `--devices bogus` said "invalid AgentConfig settings"."""
    from click.testing import CliRunner

    from llmgw_runtime.cli.main import cli

    result = CliRunner().invoke(cli, argv, env={"LLMGW_STATE_DIR": str(tmp_path), **env})
    assert result.exit_code == 1, result.output
    assert says in result.output
    assert "Config" not in result.output
