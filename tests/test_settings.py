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


def test_unprefixed_variables_are_ignored() -> None:
    assert settings.load(ControlConfig, env={"PORT": "1"}).port == 8470
