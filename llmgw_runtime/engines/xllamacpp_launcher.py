"""Run llama.cpp's own HTTP server from the ``xllamacpp`` wheel (CPU engine).

``python -m llmgw_runtime.engines.xllamacpp_launcher --model PATH --host H --port P
--alias NAME [--ctx-size N] [--threads N] [--parallel N]``

Exit codes: 0 after SIGTERM/SIGINT, 1 when the server fails to start, 2 for bad arguments
or a model file that is not there.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

SUPPORTED = ("--model", "--host", "--port", "--alias", "--ctx-size/-c", "--threads/-t",
             "--parallel/-np")


class _Once(argparse.Action):
    """Store a value, refusing a second one (argparse would keep the last): the agent gives
    --model, --host, --port and --alias before the catalog's args, which may not repeat them."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        if self.dest in getattr(namespace, "_seen", set()):
            parser.error(f"{option_string} is set by the agent and cannot be given again")
        namespace._seen = getattr(namespace, "_seen", set()) | {self.dest}
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}\nsupported flags: {', '.join(SUPPORTED)}\n")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = _Parser(prog="xllamacpp_launcher", allow_abbrev=False,
                     description="llama.cpp server on the CPU (xllamacpp)")
    parser.add_argument("--model", "-m", required=True, action=_Once)
    parser.add_argument("--host", default="127.0.0.1", action=_Once)
    parser.add_argument("--port", type=int, default=8080, action=_Once)
    parser.add_argument("--alias", "-a", default=None, action=_Once)
    parser.add_argument("--ctx-size", "-c", type=int, default=2048)
    parser.add_argument("--threads", "-t", type=int, default=1)
    parser.add_argument("--parallel", "-np", type=int, default=1)
    args, unknown = parser.parse_known_args(list(argv))
    if unknown:
        parser.error(f"unsupported arguments: {' '.join(unknown)}")
    vars(args).pop("_seen", None)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    model = args.model
    if not (os.path.isfile(model) and os.access(model, os.R_OK)):
        print(f"model file not found: {model}", file=sys.stderr, flush=True)
        return 2

    import xllamacpp  # noqa: PLC0415 - slow import, only once the arguments are good

    params = xllamacpp.CommonParams()
    params.model.path = model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    if args.alias:
        params.model_alias = {args.alias}
    try:
        server = xllamacpp.Server(params)
    except RuntimeError as exc:
        print(f"engine failed to start with model {model}: {exc}", file=sys.stderr, flush=True)
        return 1

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # llama.cpp owns SIGINT/SIGTERM once loaded: take them back.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"llmgw engine ready on {args.host}:{args.port}", file=sys.stderr, flush=True)
    while not stop.wait(1.0):
        pass
    del server
    print("llmgw engine stopped", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
