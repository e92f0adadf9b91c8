import subprocess
import sys
from pathlib import Path

import pytest

from llmgw_runtime.engines import LAUNCHER_MODULE
from llmgw_runtime.engines.xllamacpp_launcher import parse_args


def run_launcher(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", LAUNCHER_MODULE, *args],
                          capture_output=True, text=True, timeout=30)


def test_missing_model_file_exits_2_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model.gguf"
    proc = run_launcher("--model", str(missing), "--host", "127.0.0.1", "--port", "1")
    assert proc.returncode == 2
    assert f"model file not found: {missing}" in proc.stderr


def test_a_directory_is_not_a_model_file(tmp_path: Path) -> None:
    proc = run_launcher("--model", str(tmp_path))
    assert proc.returncode == 2 and "model file not found" in proc.stderr


def test_unknown_flag_exits_2_listing_the_supported_flags(tmp_path: Path) -> None:
    proc = run_launcher("--model", str(tmp_path), "--n-gpu-layers", "99")
    assert proc.returncode == 2
    assert "--n-gpu-layers" in proc.stderr
    assert "--ctx-size/-c" in proc.stderr and "--parallel/-np" in proc.stderr


def test_corrupt_model_file_exits_1_with_the_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    proc = run_launcher("--model", str(bad), "--port", "1")
    assert proc.returncode == 1
    assert f"engine failed to start with model {bad}" in proc.stderr


@pytest.mark.parametrize("extra", [["--host", "0.0.0.0"], ["--ho", "0.0.0.0"],
                                   ["-m", "/etc/passwd"], ["--alias=other"], ["--port", "80"]])
def test_the_launcher_never_lets_later_args_override_what_the_agent_set(
        extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(["--model", "/m.gguf", "--host", "127.0.0.1", "--port", "1", "--alias", "q",
                    *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "cannot be given again" in err or "unsupported arguments: --ho" in err


def test_the_launcher_takes_what_the_agent_gives_once() -> None:
    args = parse_args(["--model", "/m.gguf", "--host", "127.0.0.1", "--port", "1",
                       "--alias", "q", "-c", "512"])
    assert (args.model, args.host, args.port, args.alias, args.ctx_size) == (
        "/m.gguf", "127.0.0.1", 1, "q", 512)
    assert not hasattr(args, "_seen")
