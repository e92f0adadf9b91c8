"""End to end: the real router (gunicorn gevent workers via serve.run), fake engines as real
processes, a stand-in control service, and the real ``openai`` client."""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonschema
import openai
import pytest
import requests
from fake_control import FakeControl

from .conftest import API_KEY, Control


def _error(exc: openai.APIStatusError) -> dict[str, Any]:
    return exc.response.json()["error"]


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="chat",
                                         messages=[{"role": "user", "content": "hi"}])
    assert (out.choices[0].message.content or "").startswith("Hello from e")
    assert out.model == "chat"


def test_completions_and_embeddings_are_proxied(client: openai.OpenAI) -> None:
    assert client.completions.create(model="chat", prompt="hi").choices[0].text == "hello"
    assert client.embeddings.create(model="chat", input="hi").data[0].embedding == [0.1, 0.2, 0.3]


def test_chat_streaming_arrives_incrementally(client: openai.OpenAI) -> None:
    started = time.monotonic()
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], stream=True,
        extra_body={"fake_chunks": 4, "fake_chunk_delay_s": 0.3})
    arrivals = []
    text = ""
    for chunk in stream:
        arrivals.append(time.monotonic() - started)
        text += chunk.choices[0].delta.content or ""
    assert text == "tok0 tok1 tok2 tok3 "
    assert len(arrivals) == 4
    # the first chunk is produced at ~0.3 s and the last at ~1.2 s: they arrive spread
    # over most of those 0.9 s (a buffered stream would bring them within a few ms). A
    # loaded CI host once delayed the first by 0.3 s (0.59 s apart), so half of it.
    assert arrivals[0] < 0.8 and arrivals[-1] - arrivals[0] > 0.45


def test_models_lists_every_catalog_model(client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert {"chat", "parked", "unplaceable", "ondemand"} <= ids


def test_retrieve_gives_one_model_and_an_unknown_one_is_404(client: openai.OpenAI,
                                                            router: str) -> None:
    chat = client.models.retrieve("chat")
    assert (chat.id, chat.object, chat.owned_by) == ("chat", "model", "llmgw")
    assert chat.created == next(m.created for m in client.models.list() if m.id == "chat")
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    err = _error(info.value)
    assert (err["code"], err["type"], err["param"]) == ("model_not_found",
                                                        "invalid_request_error", "model")
    assert "'no-such-model' is not in the catalog" in err["message"]
    assert "GET /v1/models" in err["message"]
    resp = requests.get(router + "/v1/models/chat", timeout=10)      # keys are required
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"


def test_an_admin_api_path_is_answered_this_is_the_router(router: str,
                                                          control: Control) -> None:
    for method in ("GET", "PUT", "DELETE"):
        resp = requests.request(method, router + "/api/v1/status", timeout=10,
                                headers={"Authorization": "Bearer llmgw-admin-x"})
        err = resp.json()["error"]
        assert (resp.status_code, err["code"]) == (404, "not_the_control_service")
        assert err["message"].startswith("this is the llmgw router")
        assert f"llmgw ctl --url {control.url} ..." in err["message"]


def test_unknown_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=[])
    assert _error(info.value)["code"] == "model_not_found"
    assert "GET /v1/models" in _error(info.value)["message"]


def test_malformed_json_is_400_invalid_json(router: str) -> None:
    resp = requests.post(router + "/v1/chat/completions", data=b'{"model": "chat",',
                         headers={"Authorization": f"Bearer {API_KEY}",
                                  "Content-Type": "application/json"}, timeout=10)
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "invalid_json"


@pytest.mark.parametrize("key", [None, "sk-llmgw-wrong"])
def test_missing_or_wrong_api_key_is_401(router: str, key: str | None) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    resp = requests.post(router + "/v1/chat/completions", json={"model": "chat"},
                         headers=headers, timeout=10)
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=router + "/v1", api_key="sk-llmgw-wrong",
                      max_retries=0).models.list()


def test_parked_model_is_refused_at_once_with_reason(client: openai.OpenAI) -> None:
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="parked", messages=[])
    assert time.monotonic() - started < 1.0
    assert info.value.status_code == 503
    err = _error(info.value)
    assert err["code"] == "model_parked"
    assert "CUDA out of memory" in err["message"] and "llmgw ctl retry parked" in err["message"]


def test_unplaceable_model_is_refused_with_reason(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="unplaceable", messages=[])
    assert _error(info.value)["code"] == "model_unplaceable"
    assert "no a100-80g device" in _error(info.value)["message"]


def test_idle_model_is_activated_and_served_once_ready(client: openai.OpenAI,
                                                       control: FakeControl) -> None:
    out = client.chat.completions.create(model="ondemand", messages=[])
    assert out.system_fingerprint == "e1"
    assert "ondemand" in control.activations


def test_activation_refused_by_control_is_answered_at_once(client: openai.OpenAI) -> None:
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="refused", messages=[])
    assert _error(info.value)["code"] == "model_unplaceable"
    assert time.monotonic() - started < 1.0


def test_model_never_ready_times_out_with_model_not_ready(client: openai.OpenAI) -> None:
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as info:
        client.chat.completions.create(model="never", messages=[])
    assert _error(info.value)["code"] == "model_not_ready"
    assert 1.9 < time.monotonic() - started < 5


def test_dead_replica_is_retried_on_another(client: openai.OpenAI) -> None:
    for _ in range(6):
        out = client.chat.completions.create(model="deadmix", messages=[])
        assert out.system_fingerprint == "e2"


def test_every_replica_dead_is_502_upstream_error_and_reported_unreachable(
        client: openai.OpenAI, control: Control) -> None:
    """Nothing reached an engine: the router marks the replica down and tells the control
    service, then waits a tick or two for its view. This stand-in keeps listing the
    replica as ready, so the answer is a 502 naming it."""
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="alldead", messages=[])
    assert info.value.status_code == 502 and time.monotonic() - started < 2.5
    err = _error(info.value)
    assert err["code"] == "upstream_error"
    assert "r-dead" in err["message"] and "Connection refused" in err["message"]
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not any(
            p["replica_id"] == "r-dead" for p in control.unreachable_posts):
        time.sleep(0.1)
    post = next(p for p in control.unreachable_posts if p["replica_id"] == "r-dead")
    assert "Connection refused" in post["reason"]


def test_idle_map_is_posted_with_the_replicas_used(client: openai.OpenAI,
                                                   control: FakeControl) -> None:
    used = {client.chat.completions.create(model="chat", messages=[]).system_fingerprint
            for _ in range(4)}
    expected = {f"r-{name}" for name in used}
    deadline = time.monotonic() + 3
    seen: set[str] = set()
    while time.monotonic() < deadline and not expected <= seen:
        # seconds since last use, not wall times: fresh uses are a few seconds old at most
        seen = {rid for post in list(control.idle_posts) for rid, ago in post.items()
                if ago < 5}
        time.sleep(0.1)
    assert expected <= seen
    assert all(isinstance(ago, float) and 0 <= ago < 60 for post in control.idle_posts
               for ago in post.values())


def test_least_outstanding_spreads_concurrent_slow_requests(router_one: str) -> None:
    client = openai.OpenAI(base_url=router_one + "/v1", api_key=API_KEY, max_retries=0)

    def slow(_: int) -> str:
        out = client.chat.completions.create(model="chat", messages=[],
                                             extra_body={"fake_delay_s": 1.0})
        return str(out.system_fingerprint)

    with ThreadPoolExecutor(4) as pool:
        served = Counter(pool.map(slow, range(4)))
    assert served == Counter({"e1": 2, "e2": 2})


def test_busy_replica_is_avoided_while_the_other_is_free(router_one: str) -> None:
    client = openai.OpenAI(base_url=router_one + "/v1", api_key=API_KEY, max_retries=0)
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(lambda: client.chat.completions.create(
            model="chat", messages=[], extra_body={"fake_delay_s": 1.5}).system_fingerprint)
        time.sleep(0.3)
        quick = {client.chat.completions.create(model="chat", messages=[]).system_fingerprint
                 for _ in range(4)}
        busy = slow.result()
    assert len(quick) == 1 and busy not in quick


def test_client_disconnect_closes_the_upstream_stream(router_one: str,
                                                      engines: dict[str, str]) -> None:
    host, port = router_one.removeprefix("http://").split(":")
    body = json.dumps({"model": "chat", "stream": True, "fake_chunks": 400,
                       "fake_chunk_delay_s": 0.05}).encode()
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert b"data: " in sock.recv(65536) + sock.recv(65536)
    deadline = time.monotonic() + 5  # the stream would run 20 s if nobody closed it
    active = {}
    while time.monotonic() < deadline:
        active = {n: requests.get(u + "/stats", timeout=5).json()["active"]
                  for n, u in engines.items()}
        if not any(active.values()):
            break
        time.sleep(0.1)
    assert not any(active.values())


def test_openapi_schemas_match_real_responses(router: str) -> None:
    doc = requests.get(router + "/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.1")
    auth = {"Authorization": f"Bearer {API_KEY}"}

    def check(path: str, method: str, resp: requests.Response) -> None:
        schema = (doc["paths"][path][method]["responses"][str(resp.status_code)]
                  ["content"]["application/json"]["schema"])
        jsonschema.validate(resp.json(), {**schema, "components": doc["components"]})

    check("/v1/models", "get", requests.get(router + "/v1/models", headers=auth, timeout=10))
    check("/v1/models", "get", requests.get(router + "/v1/models", timeout=10))
    for name in ("chat", "nope"):
        check("/v1/models/{model}", "get",
              requests.get(router + f"/v1/models/{name}", headers=auth, timeout=10))
    check("/healthz", "get", requests.get(router + "/healthz", timeout=10))
    check("/health", "get", requests.get(router + "/health", timeout=10))   # as the engines
    for body in ({"model": "nope"}, {"model": "parked"}, {"model": 3}):
        check("/v1/chat/completions", "post",
              requests.post(router + "/v1/chat/completions", json=body, headers=auth,
                            timeout=10))
    bad = requests.post(router + "/v1/embeddings", data=b"{", headers=auth, timeout=10)
    check("/v1/embeddings", "post", bad)
