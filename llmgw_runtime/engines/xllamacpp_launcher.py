"""Run llama.cpp's own HTTP server from the ``xllamacpp`` wheel (the CPU engine).

``python -m llmgw_runtime.engines.run_cpu_engine --model PATH --host H --port P --alias
NAME [FLAGS]`` (the entry point; run_cpu_engine.py says why it is not this module) where
FLAGS are the llama-server flags of ``FLAGS`` below, mapped onto
``xllamacpp.CommonParams``; anything else is refused (exit 2). The catalog checks a model's
args with :func:`args_problem` at apply time, so a flag this engine lacks is refused there,
not after five failed starts (docs/operations.md, "The CPU engine").

Exit codes: 0 after SIGTERM/SIGINT, 1 when the server fails to start, 2 for bad arguments
or a model file that is not there. Every error is one line, printed last.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

POOLING = ("none", "mean", "cls", "last", "rank")


@dataclass(frozen=True)
class Flag:
    """One llama-server flag the CPU engine accepts: its spellings, its value (None: a
    switch) and what it sets."""

    names: tuple[str, ...]
    dest: str
    value: str | None
    default: Any
    help: str


# The flags the agent gives (owned: engines/owned.py refuses them in a catalog's args).
AGENT_FLAGS = (
    Flag(("--model", "-m"), "model", "PATH", None, "the GGUF file (from the catalog's source)"),
    Flag(("--host",), "host", "ADDR", "127.0.0.1", "the address to listen on"),
    Flag(("--port",), "port", "N", 8080, "the port to listen on"),
    Flag(("--alias", "-a"), "alias", "NAME", None, "the model's id in /v1/models"),
)
# The flags a catalog's args may give, with llama-server's meaning.
FLAGS = (
    Flag(("--ctx-size", "-c"), "ctx_size", "N", 2048,
         "context size in tokens, shared by the parallel slots (0: the model's own)"),
    Flag(("--threads", "-t"), "threads", "N", 1, "CPU threads for generation and batches"),
    Flag(("--parallel", "-np"), "parallel", "N", 1, "requests served at once (slots)"),
    Flag(("--batch-size", "-b"), "batch_size", "N", 2048, "logical batch size"),
    Flag(("--ubatch-size", "-ub"), "ubatch_size", "N", 512, "physical batch size"),
    Flag(("--embeddings", "--embedding"), "embeddings", None, False,
         "serve /v1/embeddings (an embedding model)"),
    Flag(("--pooling",), "pooling", "|".join(POOLING), None,
         "how token vectors become one embedding (default: the model's own)"),
    Flag(("--chat-template",), "chat_template", "NAME|JINJA", None,
         "a built-in template name (chatml, llama3, ...) or a Jinja template"),
)


def supported_flags(values: bool = True) -> str:
    """The catalog flags, as error messages list them: ``--ctx-size/-c N, ...`` (without
    ``values``: ``--ctx-size/-c, ...``)."""
    return ", ".join("/".join(f.names) + (f" {f.value}" if f.value and values else "")
                     for f in FLAGS)


class ArgsError(Exception):
    """The arguments are refused; the message says which and why. ``unsupported``: the
    flags this engine does not have (empty for a bad value)."""

    def __init__(self, message: str, unsupported: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.unsupported = tuple(unsupported)


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
        raise ArgsError(message)


def _count(minimum: int) -> Callable[[str], int]:
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value
    return convert


def _parser() -> _Parser:
    parser = _Parser(prog="xllamacpp_launcher", allow_abbrev=False, add_help=False,
                     description="llama.cpp server on the CPU (xllamacpp)")
    for flag in AGENT_FLAGS:
        convert = int if flag.dest == "port" else str
        parser.add_argument(*flag.names, dest=flag.dest, default=flag.default, type=convert,
                            required=flag.dest == "model", action=_Once)
    for flag in FLAGS:
        if flag.value is None:
            parser.add_argument(*flag.names, dest=flag.dest, action="store_true")
        elif flag.dest == "pooling":
            parser.add_argument(*flag.names, dest=flag.dest, choices=POOLING)
        elif flag.dest == "chat_template":
            parser.add_argument(*flag.names, dest=flag.dest, default=flag.default)
        else:
            parser.add_argument(*flag.names, dest=flag.dest, default=flag.default,
                                type=_count(0 if flag.dest == "ctx_size" else 1))
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The launcher's arguments; ArgsError naming what is refused. Pure."""
    args, unknown = _parser().parse_known_args([str(a) for a in argv])
    if unknown:
        flags = [a.split("=", 1)[0] for a in unknown if a.startswith("-")] or unknown
        shown = [a if len(a) <= 40 else a[:37] + "..." for a in flags[:5]]
        more = f" and {len(flags) - 5} more" if len(flags) > 5 else ""
        raise ArgsError(f"unsupported arguments: {' '.join(shown)}{more}", shown)
    vars(args).pop("_seen", None)
    return args


def args_problem(args: Sequence[object]) -> ArgsError | None:
    """Why the CPU engine would refuse a catalog's ``args`` (given after what the agent
    sets), or None when it accepts them. Pure: what the catalog asks at apply time."""
    try:
        parse(["--model", "/model.gguf", *(str(a) for a in args)])
    except ArgsError as exc:
        return exc
    return None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """:func:`parse`, exiting 2 with the supported flags, then the error on its own last
    line (the line an operator's one-line views show)."""
    try:
        return parse(argv)
    except ArgsError as exc:
        sys.stderr.write(f"xllamacpp_launcher: the CPU engine accepts {supported_flags()}\n"
                         f"xllamacpp_launcher: error: {exc}\n")
        sys.stderr.flush()
        raise SystemExit(2) from None


def common_params(args: argparse.Namespace, xllamacpp: Any) -> Any:
    """xllamacpp's CommonParams for parsed ``args``."""
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_ctx = args.ctx_size
    params.n_parallel = args.parallel
    params.n_batch = args.batch_size
    params.n_ubatch = args.ubatch_size
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    if args.embeddings:
        params.embedding = True
    if args.pooling is not None:
        params.pooling_type = getattr(xllamacpp.llama_pooling_type,
                                      f"LLAMA_POOLING_TYPE_{args.pooling.upper()}")
    if args.chat_template:
        params.chat_template = args.chat_template
    if args.alias:
        params.model_alias = {args.alias}
    return params


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    model = args.model
    if not (os.path.isfile(model) and os.access(model, os.R_OK)):
        print(f"model file not found: {model}", file=sys.stderr, flush=True)
        return 2

    import xllamacpp  # noqa: PLC0415 - slow import, only once the arguments are good

    try:    # held until the process leaves: dropping it tears the server down
        _server = xllamacpp.Server(common_params(args, xllamacpp))
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
    # Leave without the server's teardown: it waits for the requests it serves while
    # holding the interpreter, so a stream in flight (what a drain's timeout cuts) kept
    # the process for half a minute, past the agent's stop grace. The kernel closes the
    # sockets (a client sees its stream cut) and frees the model; nothing is on disk.
    print("llmgw engine stopped", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(0)

