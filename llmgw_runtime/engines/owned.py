"""The engine flags the agent owns: a catalog's ``args`` may not set them.

The agent decides where an engine listens (loopback, a port it picked), which weights it
loads and under which name the router knows it, and an engine serves plain HTTP without a
key of its own behind the router's API keys. A flag that changes any of that, or that makes
the engine fetch or write files on the node, would bypass those boundaries: the catalog is
refused at apply time naming the flags (catalog.py), and a driver refuses an assignment that
carries one anyway (drivers.py), with the same words.

Matching is on the flag's name: ``--flag value`` and ``--flag=value``, ``_`` read as ``-``
(vLLM's parser accepts both), and a long flag that is a shortened spelling of an owned one
(``--ho`` for ``--host``: Python's argparse, used by vLLM and by the xllamacpp launcher,
accepts unambiguous prefixes).

Deliberately not owned: vLLM's ``--tokenizer`` (a GGUF model needs one), its
``--tensor-parallel-size``/``-tp`` and ``--pipeline-parallel-size``/``-pp`` (the driver sets
them from the profile unless args do), and everything about batching, context and sampling.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import EngineError

OWNED_FLAGS: dict[str, tuple[str, ...]] = {
    "llama.cpp": (
        # where it listens and what it is called: set by the agent
        "--host", "--port", "--alias", "-a", "--api-prefix",
        # which weights: set by the agent from the catalog's source
        "-m", "--model", "-mu", "--model-url", "-dr", "--docker-repo",
        "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-hfv", "-hfrv", "--hf-repo-v",
        "-hffv", "--hf-file-v", "-hfd", "-hfrd", "--hf-repo-draft", "-hft", "--hf-token",
        "--models-dir", "--models-preset",
        # keys and TLS: the router holds the keys, the engine speaks plain HTTP to it
        "--api-key", "--api-key-file", "--ssl-key-file", "--ssl-cert-file",
        # multi-node: set by the agent from the replica's parts
        "--rpc",
        # files the engine would serve or write on the node
        "--path", "--log-file", "--slot-save-path",
    ),
    "vllm": (
        # where it listens and what it is called
        "--host", "--port", "--uds", "--served-model-name",
        # which weights, and where downloads land
        "--model", "--download-dir",
        # keys and TLS
        "--api-key", "--ssl-keyfile", "--ssl-certfile", "--ssl-ca-certs", "--ssl-cert-reqs",
        # multi-node: set by the agent from the replica's parts
        "--nnodes", "--node-rank", "--master-addr", "--master-port", "--headless",
        # a file of arguments could set any of the above
        "--config",
        # files on the node that requests could then read
        "--allowed-local-media-path",
    ),
}


def flag_name(arg: str) -> str | None:
    """The flag an argument names (``--flag=value`` -> ``--flag``, ``_`` as ``-``), or None
    for a value."""
    if not arg.startswith("-") or arg in ("-", "--") or arg[1:2].isdigit() or arg[1:2] == ".":
        return None
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name


def owned_flags_in(engine: str, args: Iterable[object]) -> list[str]:
    """The arguments among ``args`` that set a flag the agent owns for ``engine``, as they
    are spelled (without a ``=value``), in order, once each."""
    owned = OWNED_FLAGS.get(engine, ())
    longs = [f for f in owned if f.startswith("--")]
    found: list[str] = []
    for arg in args:
        name = flag_name(str(arg))
        if name is None:
            continue
        hit = name in owned or (name.startswith("--") and len(name) > 3
                                and any(f.startswith(name) for f in longs))
        spelled = str(arg).split("=", 1)[0]
        if hit and spelled not in found:
            found.append(spelled)
    return found


def owned_flags_message(engine: str, found: list[str]) -> str:
    """Why ``found`` are refused, and what to do."""
    return (f"args {', '.join(found)} set what the agent owns for {engine} (where the "
            "engine listens, which weights it loads and under which name, keys and TLS, "
            "files on the node); remove them: llmgw sets these itself")


def refuse_owned_flags(engine: str, args: Iterable[object], replica: object = None) -> None:
    """EngineError naming the owned flags in ``args``, if any (the agent's own check)."""
    found = owned_flags_in(engine, args)
    if found:
        who = f"replica {replica}: " if replica is not None else ""
        raise EngineError(who + owned_flags_message(engine, found))
