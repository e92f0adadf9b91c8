import subprocess
import sys
from pathlib import Path

import pytest

from llmgw_runtime.engines import LAUNCHER_MODULE, LlamaCppDriver
from llmgw_runtime.engines.xllamacpp_launcher import FLAGS, args_problem, common_params, parse_args


def run_launcher(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", LAUNCHER_MODULE, *args],
                          capture_output=True, text=True, timeout=30)


def test_missing_model_file_exits_2_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model.gguf"
    proc = run_launcher("--model", str(missing), "--host", "127.0.0.1", "--port", "1")
    assert proc.returncode == 2
    assert f"model file not found: {missing}" in proc.stderr


def test_a_failing_launch_prints_its_error_alone_without_a_runpy_warning(
        tmp_path: Path) -> None:
    """The agent's own command line (the driver's argv): the engine log holds the error
    and nothing else, no "<frozen runpy>: RuntimeWarning ... found in sys.modules"."""
    missing = tmp_path / "no-such-model.gguf"
    spec = LlamaCppDriver().launch({"replica_id": "r1", "model": "m", "source":
                                    f"file://{missing}", "args": [], "device_kind": "cpu"},
                                   host="127.0.0.1", port=1)
    proc = subprocess.run(spec.argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr == f"model file not found: {missing}\n", proc.stderr
    assert "RuntimeWarning" not in proc.stdout + proc.stderr


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


def test_an_unsupported_flag_is_the_last_line_printed(tmp_path: Path) -> None:
    """The supported flags first, the refusal last: the line a one-line view shows."""
    proc = run_launcher("--model", str(tmp_path), "--embeddingz", "--n-gpu-layers", "99")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2
    assert lines[-1] == ("xllamacpp_launcher: error: unsupported arguments: --embeddingz "
                         "--n-gpu-layers")
    assert "--embeddings/--embedding" in lines[-2] and "--pooling" in lines[-2]


@pytest.mark.parametrize("args", [
    [], ["--embeddings", "--pooling", "mean"], ["--embedding"], ["-c", "0"],
    ["--ctx-size=4096", "--threads", "4", "--parallel", "2"],
    ["-b", "1024", "-ub", "256", "-t", "2", "-np", "4"],
    ["--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}"],
    ["--pooling", "cls"], ["-c", 512],
])
def test_args_the_cpu_engine_accepts(args: list[object]) -> None:
    assert args_problem(args) is None


@pytest.mark.parametrize("args, unsupported, words", [
    (["--n-gpu-layers", "99"], ("--n-gpu-layers",), "unsupported arguments: --n-gpu-layers"),
    (["-ngl", "99", "--flash-attn", "on"], ("-ngl", "--flash-attn"), "-ngl --flash-attn"),
    (["--embed"], ("--embed",), "--embed"),                  # no abbreviations
    (["--metrics=1"], ("--metrics",), "--metrics"),
    (["--ctx-size", "big"], (), "'big' is not a whole number"),
    (["--threads", "0"], (), "0 is below 1"),
    (["--pooling", "max"], (), "invalid choice: 'max'"),
    (["--ctx-size"], (), "expected one argument"),
    ([8192], ("8192",), "unsupported arguments: 8192"),     # a value without its flag
])
def test_args_the_cpu_engine_refuses_are_named(args: list[str], unsupported: tuple[str, ...],
                                               words: str) -> None:
    problem = args_problem(args)
    assert problem is not None and words in str(problem)
    assert problem.unsupported == unsupported


def test_every_flag_reaches_xllamacpps_parameters() -> None:
    import xllamacpp

    args = parse_args(["--model", "/m.gguf", "--host", "127.0.0.1", "--port", "7",
                       "--alias", "tiny", "-c", "1024", "-t", "3", "-np", "2", "-b", "256",
                       "-ub", "64", "--embeddings", "--pooling", "last",
                       "--chat-template", "chatml"])
    p = common_params(args, xllamacpp)
    assert (p.model.path, p.hostnames, p.port, p.model_alias) == (
        "/m.gguf", ["127.0.0.1"], 7, {"tiny"})
    assert (p.n_ctx, p.n_parallel, p.n_batch, p.n_ubatch) == (1024, 2, 256, 64)
    assert p.cpuparams.n_threads == p.cpuparams_batch.n_threads == 3
    assert p.embedding is True and p.chat_template == "chatml"
    assert p.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_LAST


def test_every_flag_is_documented_in_the_cpu_engine_section() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = doc.split("## The CPU engine", 1)[1].split("\n## ", 1)[0]
    for flag in FLAGS:
        for name in flag.names:
            assert f"`{name}" in section, f"{name} is not in docs/operations.md's section"


def test_sigterm_with_a_stream_in_flight_leaves_at_once_and_cuts_the_stream(
        tmp_path: Path) -> None:
    # A drain's timeout stops an engine that still streams: llama.cpp's teardown waited
    # for the stream (half a minute) while holding the interpreter, past the agent's grace.
    import json
    import signal
    import threading
    import time
    import urllib.request

    from tests.support.procs import free_port
    from tests.support.tiny_gguf import write_tiny_gguf

    model, port = write_tiny_gguf(tmp_path / "tiny.gguf"), free_port()
    proc = subprocess.Popen([sys.executable, "-m", LAUNCHER_MODULE, "--model", str(model),
                             "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "4096"],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        while "ready" not in (line := proc.stderr.readline()):
            assert line, "the engine did not start"
        lines: list[bytes] = []
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                           "max_tokens": 4000, "ignore_eos": True}).encode()

        def stream() -> None:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    lines.extend(answer)
            except OSError:
                pass

        reader = threading.Thread(target=stream)
        reader.start()
        while len(lines) < 20:
            time.sleep(0.01)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        left_after = time.monotonic() - sent
        reader.join(timeout=10)
    finally:
        proc.kill()
        proc.wait()

    assert left_after < 3, left_after
    assert proc.returncode == 0
    assert b"data: [DONE]\n" not in lines          # cut, not finished
