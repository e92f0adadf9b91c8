"""telling_line: the line of a failure an operator needs, from real engine output (captured
from the xllamacpp launcher and llama.cpp on this machine, and vLLM's usual endings)."""

from __future__ import annotations

import pytest

from llmgw_runtime.status.telling import telling_line

HEAD = "engine exited with code {code}; last log lines:"
START = ("--- llmgw: starting r-1 (tiny) at Thu Dec  3 19:33:00 2026: /venv/bin/python -m "
         "llmgw_runtime.engines.xllamacpp_launcher --model /m/tiny.gguf --host 127.0.0.1 "
         "--port 40123 --alias tiny --embeddingz")


def failed(code: int, *log: str) -> str:
    """A replica's last_error as the agent's supervisor writes it."""
    return "\n".join([HEAD.format(code=code), START, *log])


CASES = [
    pytest.param(None, "-", id="nothing"),
    pytest.param("  \n\n", "-", id="blank"),
    pytest.param("the engine stopped", "the engine stopped", id="one-line"),
    pytest.param(failed(2, "xllamacpp_launcher: the CPU engine accepts --ctx-size/-c N, "
                           "--threads/-t N, --parallel/-np N",
                        "xllamacpp_launcher: error: unsupported arguments: --embeddingz"),
                 "engine exited with code 2: xllamacpp_launcher: error: unsupported "
                 "arguments: --embeddingz", id="launcher-unsupported-flag"),
    pytest.param(failed(2, "xllamacpp_launcher: error: unsupported arguments: --embeddingz",
                        "supported flags: --ctx-size/-c, --threads/-t, --parallel/-np"),
                 "engine exited with code 2: xllamacpp_launcher: error: unsupported "
                 "arguments: --embeddingz", id="listing-after-the-error"),
    pytest.param(failed(
        1,
        "0.00.018.963 I srv    load_model: loading model '/m/trunc.gguf'",
        "0.00.019.557 E llama_model_load: error loading model: tensor 'output.weight' data is "
        "not within the file bounds, model is corrupted or incomplete",
        "0.00.019.560 E llama_model_load_from_file_impl: failed to load model",
        "0.00.019.764 E cmn  common_init_: failed to load model '/m/trunc.gguf'",
        "0.00.019.765 E srv    load_model: failed to load model, '/m/trunc.gguf'",
        "0.00.019.768 I srv    operator(): operator(): cleaning up before exit...",
        "0.00.023.371 E srv          init: exiting due to model loading error",
        "engine failed to start with model /m/trunc.gguf: Failed to init server, please check "
        "the input params."),
        "engine exited with code 1: llama_model_load: error loading model: tensor "
        "'output.weight' data is not within the file bounds, model is corrupted or incomplete",
        id="llamacpp-truncated-file"),
    pytest.param(failed(
        1,
        "0.00.005.504 E gguf_init_from_reader: invalid magic characters: 'garb', expected "
        "'GGUF'",
        "0.00.005.660 E llama_model_load: error loading model: llama_model_loader: failed to "
        "load model from /m/bad.gguf",
        "0.00.005.964 E srv    load_model: failed to load model, '/m/bad.gguf'",
        "0.00.006.262 E srv          init: exiting due to model loading error",
        "engine failed to start with model /m/bad.gguf: Failed to init server, please check "
        "the input params."),
        "engine exited with code 1: gguf_init_from_reader: invalid magic characters: 'garb', "
        "expected 'GGUF'", id="llamacpp-not-a-gguf"),
    pytest.param(failed(
        1,
        "0.00.007.985 W srv          init: security: no API key is set and CORS allows all "
        "origins",
        "0.00.008.092 E srv         start: couldn't bind HTTP server socket, hostname: "
        "127.0.0.1, port: 40123",
        "0.00.008.093 I srv    operator(): operator(): cleaning up before exit...",
        "0.00.010.869 E srv          init: exiting due to HTTP server error",
        "engine failed to start with model /m/tiny.gguf: Failed to init server, please check "
        "the input params."),
        "engine exited with code 1: srv start: couldn't bind HTTP server socket, hostname: "
        "127.0.0.1, port: 40123", id="llamacpp-port-in-use"),
    pytest.param(failed(
        1, "Traceback (most recent call last):",
        '  File "/venv/lib/python3.11/site-packages/vllm/entrypoints/openai/api_server.py", '
        "line 12, in <module>",
        "    import torch",
        "ModuleNotFoundError: No module named 'torch'"),
        "engine exited with code 1: ModuleNotFoundError: No module named 'torch'",
        id="python-traceback"),
    pytest.param(failed(
        1, "INFO 12-03 19:00:01 model_runner.py:1008] Loading model weights took 13.9 GB",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.15 GiB of which 1.20 GiB is free.",
        "ERROR 12-03 19:00:09 engine.py:366] Engine process failed to start.",
        "[rank0]:[W1203 19:00:10] ProcessGroupNCCL.cpp:1250] Warning: destroy_process_group() "
        "was not called"),
        "engine exited with code 1: torch.OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.20 GiB is free.",
        id="vllm-cuda-oom"),
    pytest.param(failed(-9, "0.01.000.000 I srv  update_slots: all slots are idle"),
                 "engine exited with code -9: srv update_slots: all slots are idle",
                 id="no-telling-line-the-last-one"),
    pytest.param("engine exited with code 1; last log lines:\n" + START,
                 "engine exited with code 1; last log lines:", id="only-the-start-marker"),
    pytest.param("the workers 10.0.0.2:29500 did not accept connections within 600 s",
                 "the workers 10.0.0.2:29500 did not accept connections within 600 s",
                 id="agent-message"),
]


@pytest.mark.parametrize("text, line", CASES)
def test_the_telling_line_of_a_failure(text: str | None, line: str) -> None:
    assert telling_line(text) == line

