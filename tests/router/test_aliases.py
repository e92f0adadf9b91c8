"""A model's aliases at the router (issue 17): a request naming an alias is served by the
model (the engine sees the model's own name), /v1/models lists the aliases, a key's scope
holds for them. The router in-process, a real fake engine, the real openai client."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from fake_control import FakeControl

from tests.control.conftest import served

from .conftest import API_KEY, ROUTER_TOKEN, model, table
from .test_app_inprocess import _app, _stop

CHAT_ONLY = "sk-llmgw-chat-only"
EMBED_ONLY = "sk-llmgw-embed-only"


@pytest.fixture
def aliased(engines: dict[str, str]) -> Iterator[str]:
    ctl = FakeControl(table(model("chat", endpoints=[("r-e1", engines["e1"])],
                                  aliases=["gpt-4o-mini", "assistant"]),
                            model("embed", endpoints=[("r-e2", engines["e2"])]),
                            keys=(API_KEY, CHAT_ONLY, EMBED_ONLY),
                            scopes={CHAT_ONLY: ["chat"], EMBED_ONLY: ["embed"]}),
                      ROUTER_TOKEN).start()
    app = _app(ctl.url)
    try:
        with served(app) as url:
            yield url + "/v1"
    finally:
        _stop(app)
        ctl.stop()


def test_a_request_naming_an_alias_is_served_by_its_model(aliased: str) -> None:
    client = openai.OpenAI(base_url=aliased, api_key=API_KEY, max_retries=0)
    answer = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    assert answer.model == "chat"       # the engine was asked for the model by its name
    assert [m.id for m in client.models.list()] == ["assistant", "chat", "embed",
                                                    "gpt-4o-mini"]
    assert client.models.retrieve("assistant").id == "assistant"


def test_a_keys_scope_holds_for_the_aliases_of_its_models(aliased: str) -> None:
    chat_only = openai.OpenAI(base_url=aliased, api_key=CHAT_ONLY, max_retries=0)
    assert chat_only.chat.completions.create(
        model="assistant", messages=[{"role": "user", "content": "hi"}]).model == "chat"
    embed_only = openai.OpenAI(base_url=aliased, api_key=EMBED_ONLY, max_retries=0)
    assert [m.id for m in embed_only.models.list()] == ["embed"]
    with pytest.raises(openai.NotFoundError) as hidden:
        embed_only.chat.completions.create(
            model="assistant", messages=[{"role": "user", "content": "hi"}])
    assert "model 'assistant' is not in the catalog" in str(hidden.value)
