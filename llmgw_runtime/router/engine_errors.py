"""An engine's known error answers, said in OpenAI's shape with what to change in llmgw.

llama.cpp (``llama-server`` and the CPU engine alike) answers some requests with errors
that name its own flags or an integer ``code`` (``{"error": {"code": 501, "message": ...,
"type": "not_supported_error"}}``): an openai client raises ``InternalServerError`` on a
501 or 500 for what is the request's or the catalog's matter, and "try increasing it"
does not say that the context is the catalog entry's ``--ctx-size``. The ones known here
become ``400`` with OpenAI's ``{"error": {"message", "type", "param", "code"}}``, a string
``code`` (``context_length_exceeded`` as OpenAI says it) and a message naming the catalog
args to set. Every other answer passes as the engine gave it.

Only whole (non-streamed) answers with a status of 400 or more are looked at
(``wsgi._served``, after a canary's counts and the key's usage saw the engine's own
status): the streamed path is never touched. Pure.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import error_body

MAX_LOOKED_AT = 16 * 1024      # bytes of an error answer parsed; larger ones pass as they are
APPLY = "then `llmgw ctl apply` (docs/catalog.md)"

_CONTEXT = re.compile(r"request \((\d+) tokens\) exceeds the available context size "
                      r"\((\d+) tokens\)")
_BATCH = re.compile(r"input \((\d+) tokens\) is too large to process\. increase the physical "
                    r"batch size \(current batch size: (\d+)\)")
_PARAM = {"/v1/embeddings": "input", "/v1/completions": "prompt"}


def translate(status: int, body: bytes, model: str, path: str) -> tuple[int, bytes]:
    """``(status, body)`` of an engine's error answer as the client gets it: a known
    llama.cpp error in OpenAI's shape naming the fix, anything else unchanged."""
    if status < 400 or len(body) > MAX_LOOKED_AT or not body.lstrip().startswith(b"{"):
        return status, body
    try:
        doc = json.loads(body)
    except ValueError:
        return status, body
    error = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return status, body
    said = _known(error, model, path)
    if said is None:
        return status, body
    return 400, json.dumps(said).encode()


def _known(error: dict[str, Any], model: str, path: str) -> dict[str, Any] | None:
    message, kind = error["message"], error.get("type")
    param = _PARAM.get(path, "messages")
    if "does not support embeddings" in message:
        return error_body(
            f"model '{model}' does not serve embeddings: its engine runs without "
            "`--embeddings`. Ask the operator to add `args: [--embeddings, --pooling, mean]` "
            f"to its catalog entry, {APPLY}", "invalid_request_error",
            "embeddings_not_enabled", "model")
    if "Pooling type 'none' is not OAI compatible" in message:
        return error_body(
            f"model '{model}' serves embeddings per token (pooling none), which the OpenAI "
            "embeddings API cannot return. Ask the operator to add `--pooling mean` to its "
            f"catalog entry's args (with `--embeddings`), {APPLY}", "invalid_request_error",
            "embeddings_pooling_unsupported", "model")
    if kind == "exceed_context_size_error" or "exceeds the available context size" in message:
        found = _CONTEXT.search(message)
        sizes = (f"the request has {found[1]} tokens, more than model '{model}' takes in "
                 f"one request ({found[2]} tokens)") if found else \
            f"the request is longer than model '{model}' takes in one request"
        return error_body(
            f"{sizes}. Shorten it, or ask the operator for a larger context: `--ctx-size N` "
            "in its catalog entry's args (llama.cpp shares it among the replica's "
            f"slots), {APPLY}", "invalid_request_error",
            "context_length_exceeded", param)
    found = _BATCH.search(message)
    if found:
        return error_body(
            f"the input has {found[1]} tokens, more than model '{model}' takes in one batch "
            f"({found[2]} tokens). Shorten it, or ask the operator for larger batches: "
            f"`--batch-size N` and `--ubatch-size N` (N at least {found[1]}, and "
            f"`--ctx-size` as large) in its catalog entry's args, {APPLY}",
            "invalid_request_error", "context_length_exceeded", param)
    return None
