import subprocess
import sys
from pathlib import Path

from llmgw_runtime.engines import LAUNCHER_MODULE


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
