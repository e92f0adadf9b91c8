"""How many requests one replica serves at once (its slots), known from its launch.

Pure: a model's catalog entry in, a number out. The router admits requests only into free
slots (docs/routing.md), so this must agree with what the engine runs: the catalog's
``slots`` when set (the driver then adds the engine's flag unless the args set it,
engines/drivers.py), else the engine's flag in the args, else the engine's default.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..fleetvocab import CPU_CLASS

# The engine flag that sets its slots, and the spellings of it the args may use.
SLOT_FLAGS: dict[str, tuple[str, ...]] = {
    "llama.cpp": ("--parallel", "-np"),
    "vllm": ("--max-num-seqs",),
}
# llama.cpp's llama-server: ``--parallel`` defaults to -1 ("auto"), which resolves to 4
# slots with a unified KV cache (common/arg.cpp, tools/server; llama.cpp since late 2025;
# builds before that default to 1). The CPU engine (xllamacpp_launcher.py) defaults to 1.
LLAMA_SERVER_DEFAULT_SLOTS = 4
CPU_ENGINE_DEFAULT_SLOTS = 1
# vLLM's OpenAI server: --max-num-seqs defaults to 256 (engine/arg_utils.py); recent
# versions take 1024 on GPUs with 70 GiB or more (not A100), so 256 is the safe floor.
VLLM_DEFAULT_SLOTS = 256


def flag_value(args: Sequence[str], flags: Sequence[str]) -> str | None:
    """The value the args give any of ``flags`` (``--flag N`` or ``--flag=N``; the last
    one wins, as in the engines' own parsers), or None."""
    found: str | None = None
    for i, arg in enumerate(args):
        for flag in flags:
            if arg == flag and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(flag + "="):
                found = arg[len(flag) + 1:]
    return found


def slots_from_args(engine: str, args: Sequence[str]) -> int | None:
    """The slots the args set with the engine's flag; None when they set none (or a value
    that is not a positive whole number, e.g. llama.cpp's ``-1`` for auto)."""
    flags = SLOT_FLAGS.get(engine)
    if not flags:
        return None
    value = flag_value([str(a) for a in args], flags)
    try:
        number = int(value) if value is not None else 0
    except ValueError:
        return None
    return number if number > 0 else None


def default_slots(engine: str, device_class: str) -> int | None:
    """The engine's own default: llama.cpp on class cpu is the CPU engine (the xllamacpp
    launcher), elsewhere llama-server; vLLM's; None for an engine llmgw does not know."""
    if engine == "llama.cpp":
        return CPU_ENGINE_DEFAULT_SLOTS if device_class == CPU_CLASS \
            else LLAMA_SERVER_DEFAULT_SLOTS
    if engine == "vllm":
        return VLLM_DEFAULT_SLOTS
    return None


def slots_of(spec: Any) -> int | None:
    """The slots of one replica of ``spec`` (a catalog.ModelSpec): its ``slots``, else
    the engine's flag in its args, else the engine's default; None when unknown."""
    if spec.slots is not None:
        return int(spec.slots)
    from_args = slots_from_args(spec.engine, spec.args)
    if from_args is not None:
        return from_args
    if spec.engine in SLOT_FLAGS and flag_value(list(spec.args),
                                                SLOT_FLAGS[spec.engine]) is not None:
        return None     # set, but to what llmgw cannot count (auto): unknown
    return default_slots(spec.engine, spec.profile.klass)


def slots_flag(engine: str, slots: int | None, args: Sequence[str]) -> list[str]:
    """What the driver adds to the args so the engine runs ``slots`` (the catalog's):
    the engine's flag and value, unless the args set the flag themselves or the engine
    has none."""
    flags = SLOT_FLAGS.get(engine)
    if slots is None or not flags or flag_value([str(a) for a in args], flags) is not None:
        return []
    return [flags[0], str(int(slots))]
