"""Operator-chosen tokens (issue 28): LLMGW_ADMIN_TOKEN, LLMGW_JOIN_TOKEN and
LLMGW_ROUTER_TOKEN too short or too plain are refused at start by the control service,
the router and the agent, with one message (security.token_problem) that says how to make
one and never shows the token; the tokens this repository sets by hand pass."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgw_runtime import settings
from llmgw_runtime.agent.config import AgentConfig
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.errors import ConfigError
from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.security import new_token, token_problem

from .conftest import ADMIN, JOIN, ROUTER

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("token", "says"), [
    ("", None),                                   # unset: whether it is required is apart
    ("hunter", "too short (6 characters): use at least 24"),
    ("llmgw-admin-test", "too short (16 characters)"),
    ("a" * 40, "repeats too few characters (1 different)"),
    ("abababababababababababababab", "(2 different)"),
    ("0123456789abcdef0123456789abcdef0123456789abcdef", None),   # openssl rand -hex 24
    pytest.param(new_token("admin"), None, id="new_token"),   # random: a stable id
])
def test_weak_tokens_are_named_with_how_to_make_one(token: str, says: str | None) -> None:
    problem = token_problem("LLMGW_ADMIN_TOKEN", token)
    if says is None:
        assert problem is None
        return
    assert problem is not None and says in problem
    assert problem.startswith("LLMGW_ADMIN_TOKEN ") and "openssl rand -hex 24" in problem
    assert token not in problem


def test_the_control_service_refuses_short_tokens_at_start_naming_each() -> None:
    with pytest.raises(ConfigError) as info:
        settings.load(ControlConfig, env={"LLMGW_ADMIN_TOKEN": "hunter2hunter2",
                                          "LLMGW_ROUTER_TOKEN": "r" * 30,
                                          "LLMGW_JOIN_TOKEN": JOIN})
    text = str(info.value)
    assert "LLMGW_ADMIN_TOKEN is too short (14 characters)" in text
    assert "LLMGW_ROUTER_TOKEN repeats too few characters" in text
    assert "LLMGW_JOIN_TOKEN" not in text and "hunter2" not in text
    cfg = settings.load(ControlConfig, env={"LLMGW_ADMIN_TOKEN": ADMIN})   # unset: generated
    assert cfg.join_token == ""


def test_the_router_and_the_agent_refuse_short_tokens_at_start() -> None:
    with pytest.raises(ConfigError, match="LLMGW_ROUTER_TOKEN is too short"):
        settings.load(RouterConfig, env={"LLMGW_CONTROL_URL": "http://127.0.0.1:8470",
                                         "LLMGW_ROUTER_TOKEN": "router"})
    assert not any("TOKEN" in p for p in RouterConfig(control_url="http://c:1",
                                                      router_token=ROUTER).validate())
    agent = AgentConfig(control_url="http://c:1", join_token="join-me", devices="none")
    assert any("LLMGW_JOIN_TOKEN is too short" in p for p in agent.validate())
    agent = AgentConfig(control_url="http://c:1", join_token=JOIN, devices="none")
    assert not any("TOKEN" in p for p in agent.validate())


def test_the_tokens_set_by_hand_in_this_repository_pass() -> None:
    """Molecule's scenarios, the server-init fixture and the test suites' constants."""
    files = [*ROOT.glob("molecule/*/molecule.yml"), *ROOT.glob("roles/*/molecule/*/molecule.yml"),
             ROOT / "tests/fixtures/server_init/control_env.yml"]
    found = {m.group(2) for f in files for m in re.finditer(
        r"llmgw_(admin|join|router)_token:\s*(\S+)", f.read_text())}
    from tests.router.conftest import ROUTER_TOKEN

    found |= {ADMIN, JOIN, ROUTER, ROUTER_TOKEN}
    assert len(found) >= 10
    assert {t: token_problem("T", t) for t in found if token_problem("T", t)} == {}
