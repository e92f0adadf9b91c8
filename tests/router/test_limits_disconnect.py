"""A key's tokens-per-minute limit under the disconnect attack, through the real router in
front of a streaming engine: a client that hangs up before a stream's final usage event
used to be charged the router's prompt estimate (about 20 tokens), so a 100 tokens/minute
key got 1,000 tokens in 20 s and its usage showed none. Now a stream cut short is charged
the prompt's estimate plus one token per event relayed, and booked as the key's usage."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from llmgw_runtime.security import hash_token

from .conftest import ROUTER_TOKEN, model, table
from .usage_support import UsageControl, router_at

KEY = "sk-llmgw-limit-greedy"
TPM = 120


@pytest.fixture(scope="module")
def router(engines: dict[str, str]) -> Iterator[tuple[str, UsageControl]]:
    routes = table(model("chat", endpoints=[("r-e1", engines["e1"])]), keys=[KEY])
    routes["key_limits"] = {hash_token(KEY): {"name": "greedy", "tpm": TPM}}
    ctl = UsageControl(routes, ROUTER_TOKEN).start()
    try:
        with router_at(ctl.url, workers=2) as url:
            yield url, ctl
    finally:
        ctl.stop()


def _grab(url: str, events: int) -> tuple[int, int]:
    """One stream read for ``events`` data events, then hung up on: (HTTP status, content
    events received)."""
    body = json.dumps({"model": "chat", "stream": True, "messages": [],
                       "fake_chunks": 200, "fake_chunk_delay_s": 0.01}).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
                     b"Authorization: Bearer %b\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (KEY.encode(), len(body), body))
        seen = b""
        while seen.count(b'"content"') < events:
            data = sock.recv(65536)
            if not data:
                break
            seen += data
        status = int(seen[9:12]) if seen.startswith(b"HTTP/1.1 ") else 0
        return status, seen.count(b'"content"')


def test_streams_cut_before_their_usage_are_charged_what_was_relayed(
        router: tuple[str, UsageControl]) -> None:
    url, ctl = router
    received = 0
    started = time.monotonic()
    while time.monotonic() - started < 12:          # the attack: 4 at a time, hung up early
        results = [_grab(url, 40) for _ in range(4)]
        received += sum(n for status, n in results if status == 200)
        if all(status == 429 for status, _ in results):
            time.sleep(0.5)
    elapsed_min = (time.monotonic() - started) / 60
    # The key's limit holds within 2x: its bucket (one minute's worth) plus what refills.
    allowed = TPM + TPM * elapsed_min
    assert received <= 2 * allowed, f"{received} tokens went out; the limit allows {allowed:.0f}"
    # and what went out is booked as the key's usage (not 0 tokens)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        booked = ctl.totals().get((hash_token(KEY), "chat"), (0, 0, 0))
        if booked[2] >= received:
            break
        time.sleep(0.2)
    assert booked[2] >= received, (booked, received)
