"""A key limited to some models sees only those; an expired key is refused saying so
(issue 17). The router in-process, a stand-in control service, a real fake engine and
the real openai client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from fake_control import FakeControl

from llmgw_runtime.security import hash_token
from tests.control.conftest import served

from .conftest import API_KEY, ROUTER_TOKEN, Control, model, table
from .test_app_inprocess import _app, _stop

SCOPED = "sk-llmgw-scoped-key"
OLD = "sk-llmgw-expired-key"


@pytest.fixture
def scoped(engines: dict[str, str]) -> Iterator[FakeControl]:
    ctl = FakeControl(table(model("chat", endpoints=[("r-e1", engines["e1"])]),
                            model("secret", endpoints=[("r-e2", engines["e2"])]),
                            keys=(API_KEY, SCOPED, OLD), scopes={SCOPED: ["chat"]},
                            expires_in_s={OLD: -5.0}),
                      ROUTER_TOKEN).start()
    yield ctl
    ctl.stop()


def test_a_scoped_key_sees_only_its_models(scoped: FakeControl) -> None:
    app = _app(scoped.url)
    try:
        with served(app) as url:
            mine = openai.OpenAI(base_url=url + "/v1", api_key=SCOPED, max_retries=0)
            assert [m.id for m in mine.models.list()] == ["chat"]
            assert mine.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hi"}]).choices
            with pytest.raises(openai.NotFoundError) as hidden:
                mine.chat.completions.create(
                    model="secret", messages=[{"role": "user", "content": "hi"}])
            with pytest.raises(openai.NotFoundError) as absent:
                mine.chat.completions.create(
                    model="nosuch", messages=[{"role": "user", "content": "hi"}])
            # a model outside the scope looks exactly like one that does not exist
            assert hidden.value.body["message"] == absent.value.body["message"].replace(  # type: ignore[index]
                "nosuch", "secret")
            with pytest.raises(openai.NotFoundError):
                mine.models.retrieve("secret")
            everything = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
            assert [m.id for m in everything.models.list()] == ["chat", "secret"]
    finally:
        _stop(app)


def test_an_expired_key_is_refused_saying_so(scoped: FakeControl) -> None:
    app = _app(scoped.url)
    try:
        with served(app) as url:
            old = openai.OpenAI(base_url=url + "/v1", api_key=OLD, max_retries=0)
            with pytest.raises(openai.AuthenticationError) as refused:
                old.models.list()
            assert "this API key has expired" in str(refused.value)
    finally:
        _stop(app)


def test_a_key_expires_on_the_routers_clock_between_two_tables(
        engines: dict[str, str]) -> None:
    ctl = FakeControl(table(model("chat", endpoints=[("r-e1", engines["e1"])]),
                            expires_in_s={API_KEY: 1.0}), ROUTER_TOKEN).start()
    app = _app(ctl.url, refresh_interval_s=60)      # no new table in the meantime
    try:
        with served(app) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
            assert [m.id for m in client.models.list()] == ["chat"]
            time.sleep(1.2)
            with pytest.raises(openai.AuthenticationError):
                client.models.list()
    finally:
        _stop(app)
        ctl.stop()


LIMITED = "sk-llmgw-two-a-minute"


def test_where_keys_are_optional_a_sent_key_is_still_checked(
        engines: dict[str, str]) -> None:
    # `llmgw up`'s router (issue 28): no key is served as anonymous, but a key that is
    # sent brings its scope, limits and usage, and a wrong or expired one is refused.
    routes = table(model("chat", endpoints=[("r-e1", engines["e1"])]),
                   model("secret", endpoints=[("r-e2", engines["e2"])]),
                   keys=(SCOPED, OLD, LIMITED), scopes={SCOPED: ["chat"]},
                   expires_in_s={OLD: -5.0})
    routes["key_limits"] = {hash_token(LIMITED): {"name": "two", "rpm": 2}}
    ctl = Control(routes, ROUTER_TOKEN).start()
    app = _app(ctl.url, require_api_key=False, refresh_interval_s=60)   # one tick only
    web = app.test_client()

    def chat(key: str | None, name: str = "chat") -> Any:
        return web.post("/v1/chat/completions", json={"model": name, "messages": []},
                        headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        assert chat(None).status_code == 200
        # the control service hears that this router serves requests without a key (the
        # first tick; its usage report follows it at once)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not ctl.idle_maps:
            time.sleep(0.05)
        assert ctl.idle_maps and ctl.idle_maps[0]["keys_optional"] is True
        time.sleep(0.2)
        assert chat("none").status_code == 200        # the openai client's placeholder
        bogus = chat("sk-llmgw-bogus")
        assert bogus.status_code == 401 and "not valid" in bogus.get_json()["error"]["message"]
        assert web.get("/v1/models", headers={"X-Api-Key": "sk-llmgw-bogus"}
                       ).status_code == 401
        assert "expired" in chat(OLD).get_json()["error"]["message"]
        assert chat(SCOPED, "secret").status_code == 404 and chat(SCOPED).status_code == 200
        assert [chat(LIMITED).status_code for _ in range(3)] == [200, 200, 429]
        usage = app.extensions["llmgw_router"].usage.take()
        assert usage[(hash_token(LIMITED), "chat")][0] == 2
        assert usage[("-", "chat")][0] >= 1           # "none": anonymous
    finally:
        _stop(app)
        ctl.stop()
