"""The service commands refuse bad settings with every problem at once, before starting."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from llmgw_runtime.cli.main import cli


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), env=env or {})
    return result.exit_code, result.output


def test_server_migrate_creates_the_store(tmp_path: Path) -> None:
    code, out = invoke("server", "--database-url", f"sqlite:///{tmp_path}/s.db", "migrate")
    assert code == 0 and "store migrated to revision 0005" in out
    assert (tmp_path / "s.db").is_file()


def test_agent_without_control_url_or_join_token_names_both() -> None:
    code, out = invoke("agent", env={"LLMGW_CONTROL_URL": "", "LLMGW_JOIN_TOKEN": ""})
    assert code == 1
    assert "LLMGW_CONTROL_URL" in out and "LLMGW_JOIN_TOKEN" in out


def test_router_without_its_token_refuses_to_start() -> None:
    code, out = invoke("router", "--control-url", "http://127.0.0.1:1",
                       env={"LLMGW_ROUTER_TOKEN": ""})
    assert code == 1 and "router_token" in out.lower()


def test_bad_environment_values_are_reported_together() -> None:
    code, out = invoke("server", "migrate", env={"LLMGW_PORT": "x", "LLMGW_WORKERS": "many"})
    assert code == 1
    assert "LLMGW_PORT='x' is not an integer" in out
    assert "LLMGW_WORKERS='many' is not an integer" in out


def test_up_refuses_a_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, out = invoke("up", "--state-dir", str(tmp_path), "--control-port", str(port))
    assert code == 1 and f"port {port} for the control service is in use" in out
