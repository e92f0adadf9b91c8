"""Refusals per API key (issue 29): a request the router answers with its own error once
its key is known to be one of the table's (over the key's rpm, a model outside its scope,
an expired key) is booked in the usage report as ``refused`` under the key's hash and the
model; a request without a key or with an invalid key books nothing per key. The router
in-process, its real routes loop posting to a stand-in control service that parses each
report with the real message, and a real fake engine."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from llmgw_runtime.api.usage import NO_KEY, UNKNOWN_MODEL, UsageEntry
from llmgw_runtime.security import hash_token
from tests.support.procs import wait_until

from .conftest import ROUTER_TOKEN, model, table
from .test_app_inprocess import _app, _stop
from .usage_support import UsageControl

LIMITED, SCOPED, OLD = "sk-llmgw-refused-rpm", "sk-llmgw-refused-scope", "sk-llmgw-refused-old"
INVALID = "sk-llmgw-refused-invalid"
CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture
def control(engines: dict[str, str]) -> Iterator[UsageControl]:
    routes = table(model("chat", endpoints=[("r-e1", engines["e1"])]),
                   model("secret", endpoints=[("r-e2", engines["e2"])]),
                   keys=(LIMITED, SCOPED, OLD), scopes={SCOPED: ["chat"]},
                   expires_in_s={OLD: -5.0})
    routes["key_limits"] = {hash_token(LIMITED): {"name": "limited", "rpm": 1}}
    ctl = UsageControl(routes, ROUTER_TOKEN).start()
    yield ctl
    ctl.stop()


def _booked(control: UsageControl) -> dict[tuple[str, str], tuple[int, int]]:
    """(key hash, model) -> (requests, refused) of every report so far."""
    out: Counter[tuple[str, str, str]] = Counter()
    for report in list(control.reports):
        for e in report.entries:
            out[(e.key, e.model, "r")] += e.requests
            out[(e.key, e.model, "x")] += e.refused
    return {(k, m): (out[(k, m, "r")], out[(k, m, "x")]) for k, m, _ in out}


def test_a_known_keys_refusals_are_booked_under_it_and_no_key_books_nothing(
        control: UsageControl) -> None:
    app = _app(control.url, require_api_key=True)
    try:
        client = app.test_client()

        def post(key: str | None, name: str) -> int:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return client.post(CHAT, json={"model": name, **BODY}, headers=headers).status_code

        # first what books nothing per key: no key, an invalid key (one report holds all)
        assert post(None, "chat") == 401 and post(INVALID, "chat") == 401
        assert post(LIMITED, "chat") == 200
        assert post(LIMITED, "chat") == 429            # over its rpm of 1
        assert post(SCOPED, "secret") == 404           # outside its scope: looks absent
        assert post(OLD, "chat") == 401                # expired
        want = {(hash_token(LIMITED), "chat"): (1, 1),
                (hash_token(SCOPED), UNKNOWN_MODEL): (0, 1),
                (hash_token(OLD), UNKNOWN_MODEL): (0, 1)}
        wait_until(lambda: _booked(control) == want, 10, "the refusals in a usage report")
        keys = {k for k, _ in _booked(control)}
        assert NO_KEY not in keys and hash_token(INVALID) not in keys
    finally:
        _stop(app)


def test_an_older_routers_entry_without_refused_still_parses() -> None:
    entry = UsageEntry.model_validate_json(
        '{"key": "-", "model": "chat", "requests": 2, "prompt_tokens": 3, '
        '"completion_tokens": 4}')
    assert (entry.requests, entry.refused) == (2, 0)
