"""The tokens of an engine's answer, read from its ``usage`` object as the answer passes.

Where each API puts it:

- chat/completions, completions, embeddings: ``usage.prompt_tokens`` and
  ``usage.completion_tokens`` (0 for embeddings), in the answer, or in a stream's chunk
  that carries it: a chat stream has it only when ``stream_options.include_usage`` asked
  for it, in a last chunk with empty ``choices`` (:func:`usage_asked` adds the request;
  :class:`StreamScan` then removes that chunk, which the client did not ask for);
- responses: ``usage.input_tokens`` and ``usage.output_tokens``, in a stream in the
  ``response.completed`` event's response;
- messages (Anthropic): ``usage.input_tokens`` plus the cached input
  (``cache_read_input_tokens``, ``cache_creation_input_tokens``: Anthropic counts them
  apart) and ``usage.output_tokens``, in a stream in ``message_start`` and then
  ``message_delta`` (whose ``output_tokens`` is the running total).

Cost: a whole answer is searched for its ``"usage"`` member from the end and only that
object is decoded (the body is never decoded whole nor encoded again); a stream's chunks
are searched for ``"usage"`` and only the events that hold it are decoded. A JSON member
name can only be that text outside of strings (inside one its quotes are escaped).
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
MAX_TOKENS = 1_000_000_000       # a larger count from an engine is not believed
MAX_SCANNED = 16 * 1024 * 1024   # bytes of one event (or of a chunked non-SSE answer)
_USAGE = b'"usage"'
_USAGE_AT = re.compile(rb'\s*:\s*\{')
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')
_MESSAGES_INPUT = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
_decoder = json.JSONDecoder()


class Tokens(NamedTuple):
    prompt: int
    completion: int


def _count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS:
        return value
    return None


def tokens_of(path: str, usage: Any, before: Tokens | None = None) -> Tokens | None:
    """The tokens a ``usage`` object of ``path``'s API says (None: not a usable one).
    ``before``: what earlier events of the same stream said (Anthropic's message_delta
    carries only what changed)."""
    if not isinstance(usage, dict):
        return None
    if path == MESSAGES:
        counts = {k: _count(usage[k]) for k in (*_MESSAGES_INPUT, "output_tokens")
                  if k in usage}
        if not counts or None in counts.values():
            return None
        output = counts.pop("output_tokens", None)
        prompt = sum(n for n in counts.values() if n is not None) if counts else None
        return Tokens(prompt if prompt is not None else (before.prompt if before else 0),
                      output if output is not None else (before.completion if before else 0))
    prompt_name, completion_name = (("input_tokens", "output_tokens") if path == RESPONSES
                                    else ("prompt_tokens", "completion_tokens"))
    prompt = _count(usage.get(prompt_name))
    completion = _count(usage.get(completion_name, 0))
    if prompt is None or completion is None:
        return None
    return Tokens(prompt, completion)


def usage_in_body(path: str, data: bytes) -> Tokens | None:
    """The tokens of a whole JSON answer: its last ``"usage": {...}`` member, decoded
    alone."""
    end = len(data)
    while True:
        at = data.rfind(_USAGE, 0, end)
        if at < 0:
            return None
        end = at
        match = _USAGE_AT.match(data, at + len(_USAGE))
        if match is None:
            continue
        start = match.end() - 1
        try:
            text = data[start:start + 65536].decode("utf-8", "replace")
            usage, _ = _decoder.raw_decode(text)
        except ValueError:
            continue
        found = tokens_of(path, usage)
        if found is not None:
            return found


def usage_asked(path: str, doc: dict[str, Any]) -> bool:
    """Whether the router must ask the engine for a stream's usage: a chat or text
    completion stream whose client did not ask (``stream_options.include_usage``)."""
    if path not in (CHAT, COMPLETIONS) or doc.get("stream") is not True:
        return False
    options = doc.get("stream_options")
    return not (isinstance(options, dict) and options.get("include_usage") is True)


def asking_usage(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``stream_options.include_usage`` set (its other options kept)."""
    options = doc.get("stream_options")
    return {**doc, "stream_options": {**(options if isinstance(options, dict) else {}),
                                      "include_usage": True}}


_ASK = b'{"stream_options":{"include_usage":true}'


def asking_usage_body(doc: dict[str, Any], body: bytes) -> bytes:
    """``body`` (whose JSON is ``doc``) asking for the stream's usage: without
    ``stream_options`` in it, the field is put in front of the others without decoding
    and encoding the whole request again (a long prompt's JSON costs more to write than
    the rest of a request)."""
    if "stream_options" not in doc:
        start = body.find(b"{")
        rest = body[start + 1:]
        return _ASK + (b"" if rest.lstrip()[:1] == b"}" else b",") + rest
    return json.dumps(asking_usage(doc)).encode()


def _data(event: bytes) -> Any:
    """The decoded JSON of an SSE event's ``data:`` lines, or None."""
    lines = [line[5:] for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    payload = b"\n".join(line[1:] if line.startswith(b" ") else line for line in lines)
    payload = payload.rstrip(b"\r\n ")
    if not payload.startswith(b"{"):
        return None
    try:
        return json.loads(payload)
    except ValueError:
        return None


class StreamScan:
    """Reads the usage of a server-sent-events answer as its chunks pass (``feed`` gives
    back what to pass on, ``end`` what is left at the end). With ``strip`` (the router
    asked for a chat stream's usage), the usage-only chunk is removed and any other field
    it carries that the chunk before it lacks (llama.cpp's ``timings``, which it puts on
    the finishing chunk when usage is not asked for) goes onto that chunk, so the client
    receives what it would have without the router's request. Only then are events held
    back: the incomplete end of a chunk, and a finishing chunk (``finish_reason`` set)
    until the next event arrives."""

    __slots__ = ("path", "tokens", "events", "_strip", "_carry", "_held", "_gave_up")

    def __init__(self, path: str, strip: bool = False) -> None:
        self.path = path
        self.tokens: Tokens | None = None
        self.events = 0        # data events seen: what a stream cut short is charged
        self._strip = strip
        self._carry = b""
        self._held: bytes | None = None
        self._gave_up = False

    def feed(self, chunk: bytes) -> bytes:
        self.events += chunk.count(b"data:")
        if self._gave_up:
            return chunk
        data = self._carry + chunk if self._carry else chunk
        cut = data.rfind(b"\n\n")
        if cut < 0:
            if len(data) > MAX_SCANNED:        # no event ends: pass it on, stop looking
                self._gave_up = True
                self._carry = b""
                return self._release() + data if self._strip else chunk
            self._carry = data
            return b"" if self._strip else chunk
        complete, self._carry = data[:cut + 2], data[cut + 2:]
        if not self._strip:
            if _USAGE in complete:
                for event in _events(complete):
                    if _USAGE in event:
                        self._take(_data(event))
            return chunk
        return self._filter(complete)

    def end(self) -> bytes:
        """What is still held back, once the answer ended."""
        rest = self._carry
        self._carry = b""
        return self._release() + rest if self._strip else b""

    def _release(self) -> bytes:
        held, self._held = self._held, None
        return held or b""

    def _take(self, doc: Any) -> None:
        if not isinstance(doc, dict):
            return
        if self.path == RESPONSES:
            response = doc.get("response")
            usage = response.get("usage") if isinstance(response, dict) else None
        elif self.path == MESSAGES:
            message = doc.get("message")
            usage = (message.get("usage") if doc.get("type") == "message_start"
                     and isinstance(message, dict) else doc.get("usage"))
        else:
            usage = doc.get("usage")
        found = tokens_of(self.path, usage, self.tokens)
        if found is not None:
            self.tokens = found

    def _filter(self, complete: bytes) -> bytes:
        if _USAGE not in complete and _FINISHED.search(complete) is None:
            # No usage and no finishing chunk among these events (nearly every chunk of a
            # stream): passed on as they are, after what was held, without splitting.
            held = self._held
            if held is None:
                return complete
            self._held = None
            return held + complete
        out = []
        for event in _events(complete):
            if _USAGE in event:
                doc = _data(event)
                self._take(doc)
                if isinstance(doc, dict) and doc.get("choices") == [] \
                        and isinstance(doc.get("usage"), dict):
                    if self._held is not None:
                        self._held = _with_fields_of(self._held, event, doc)
                    continue                   # the usage chunk: not the client's
            if _FINISHED.search(event):
                out.append(self._release())
                self._held = event
                continue
            out.append(self._release())
            out.append(event)
        return b"".join(out)


def _events(complete: bytes) -> list[bytes]:
    """The events of ``complete`` (which ends with a blank line), each with its blank
    line, so that joining them gives ``complete`` back."""
    out, pos = [], 0
    while pos < len(complete):
        cut = complete.find(b"\n\n", pos)
        out.append(complete[pos:cut + 2])
        pos = cut + 2
    return out


def _with_fields_of(held: bytes, usage_event: bytes, usage_doc: dict[str, Any]) -> bytes:
    """The held chunk with the members of the usage chunk it lacks (but ``usage``), as
    the engine wrote them, appended to its JSON object."""
    held_doc = _data(held)
    close = held.rfind(b"}")
    if not isinstance(held_doc, dict) or close < 0 or held.count(b"data:") != 1:
        return held
    extra = [k for k in usage_doc if k not in held_doc and k != "usage"]
    if not extra:
        return held
    text = usage_event.decode("utf-8", "replace")
    members = b"".join(b"," + json.dumps(k).encode() + b":"
                       + _raw_value(text, k, usage_doc[k]).encode() for k in extra)
    return held[:close] + members + held[close:]


def _raw_value(text: str, name: str, value: Any) -> str:
    """The text of member ``name`` (whose value is ``value``) in the JSON ``text``, as it
    was written; else ``value`` encoded compactly."""
    needle = json.dumps(name)
    at = text.find(needle)
    while at >= 0:
        pos = at + len(needle)
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and text[pos] == ":":
            pos += 1
            while pos < len(text) and text[pos] in " \t":
                pos += 1
            try:
                found, end = _decoder.raw_decode(text, pos)
            except ValueError:
                found, end = None, pos
            if end > pos and found == value:
                return text[pos:end]
        at = text.find(needle, at + 1)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class BodyScan:
    """A JSON answer that came without a length (chunked): passed on as it arrives, kept
    (up to :data:`MAX_SCANNED`) and read whole at the end."""

    __slots__ = ("path", "tokens", "_parts", "_size")

    def __init__(self, path: str) -> None:
        self.path = path
        self.tokens: Tokens | None = None
        self._parts: list[bytes] | None = []
        self._size = 0

    def feed(self, chunk: bytes) -> bytes:
        if self._parts is not None:
            self._size += len(chunk)
            if self._size > MAX_SCANNED:
                self._parts = None
            else:
                self._parts.append(chunk)
        return chunk

    def end(self) -> bytes:
        if self._parts:
            self.tokens = usage_in_body(self.path, b"".join(self._parts))
        self._parts = None
        return b""
