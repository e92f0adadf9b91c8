"""The router role's settings file, rendered by Ansible's own templating: the CORS origins
an operator lists reach the router as LLMGW_CORS_ORIGINS, and none by default."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.settings import load

ROLE = Path(__file__).resolve().parents[2] / "roles" / "llmgw_router"


def render(**overrides: Any) -> dict[str, str]:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables = {**{name: trust_as_template(value) if isinstance(value, str) else value
                    for name, value in defaults.items()},
                 "inventory_hostname": "r1", "groups": {"llmgw_router": ["r1"]},
                 "llmgw_control_url": "https://control:8470", "ansible_managed": "-",
                 "llmgw_router_token": "llmgw-router-" + "x1" * 16, "llmgw_tls_enabled": False,
                 "_llmgw_router_group": "llmgw", "_llmgw_router_needs_ca": False,
                 "llmgw_router_env": {}, **overrides}
    text = Templar(loader=DataLoader(), variables=variables).template(
        trust_as_template((ROLE / "templates" / "router.env.j2").read_text()))
    return dict(line.split("=", 1) for line in str(text).splitlines()
                if line and not line.startswith("#"))


def test_listed_cors_origins_reach_the_router_and_none_are_set_by_default(
        monkeypatch: Any) -> None:
    assert "LLMGW_CORS_ORIGINS" not in render()
    env = render(llmgw_router_cors_origins=["https://app.example.com", "http://localhost:5173"])
    assert env["LLMGW_CORS_ORIGINS"] == "https://app.example.com,http://localhost:5173"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = load(RouterConfig)
    assert config.cors_origin_set == {"https://app.example.com", "http://localhost:5173"}
    assert config.validate() == []
