"""A tiny random-weight llama GGUF (~0.5 MB) that llama.cpp loads in ~0.1 s.

Written as shared/recipes/engine-llamacpp-cpu.md describes: 2 layers, hidden 64, 4 heads
(2 KV heads), feed-forward 128, F32 tensors; a "llama" tokenizer with <unk>, <s>, </s>, all
256 byte tokens typed BYTE and some NORMAL pieces with scores; a ChatML chat template.
The weights come from a fixed seed, so the file is the same on every run. It generates
deterministic gibberish.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

N_LAYERS = 2
HIDDEN = 64
N_HEADS = 4
N_KV_HEADS = 2
FFN = 128
CONTEXT = 2048
SEED = 1234

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_NORMAL_PIECES = [
    "\u2581the", "\u2581a", "\u2581is", "\u2581of", "\u2581and", "\u2581to", "\u2581in",
    "\u2581hello", "\u2581world", "\u2581model", "\u2581llm", "\u2581gw", "er", "ing", "ed",
    "\u2581", "e", "t", "a", "o", "i", "n", "s", "h", "r", "l", "d",
    "<|im_start|>", "<|im_end|>", "user", "assistant", "system",
]


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    scores = [0.0, 0.0, 0.0]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(gguf.TokenType.BYTE)
        scores.append(0.0)
    for i, piece in enumerate(_NORMAL_PIECES):
        tokens.append(piece)
        types.append(gguf.TokenType.NORMAL)
        scores.append(-float(i + 1))
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(path: str | Path) -> Path:
    """Write the tiny model to ``path`` (parents created) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(SEED)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    head_dim = HIDDEN // N_HEADS

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("llmgw-tiny-random")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(N_LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(N_HEADS)
    writer.add_head_count_kv(N_KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_chat_template(CHATML)

    def tensor(name: str, shape: tuple[int, ...], ones: bool = False) -> None:
        if ones:
            data = np.ones(shape, dtype=np.float32)
        else:
            data = (rng.standard_normal(shape) * 0.02).astype(np.float32)
        writer.add_tensor(name, data)

    kv_dim = head_dim * N_KV_HEADS
    tensor("token_embd.weight", (n_vocab, HIDDEN))
    tensor("output_norm.weight", (HIDDEN,), ones=True)
    tensor("output.weight", (n_vocab, HIDDEN))
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        tensor(p + "attn_norm.weight", (HIDDEN,), ones=True)
        tensor(p + "attn_q.weight", (HIDDEN, HIDDEN))
        tensor(p + "attn_k.weight", (kv_dim, HIDDEN))
        tensor(p + "attn_v.weight", (kv_dim, HIDDEN))
        tensor(p + "attn_output.weight", (HIDDEN, HIDDEN))
        tensor(p + "ffn_norm.weight", (HIDDEN,), ones=True)
        tensor(p + "ffn_gate.weight", (FFN, HIDDEN))
        tensor(p + "ffn_up.weight", (FFN, HIDDEN))
        tensor(p + "ffn_down.weight", (HIDDEN, FFN))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
