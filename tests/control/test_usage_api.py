"""Usage at the control service (issue 17): routers' reports are applied once per reporter
and sequence number (also when the same report arrives twice at once), stored by key name
and hour, read back by admins (API, console, /metrics), and hostile reports are refused
whole, naming the field. Each test runs on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import requests

from llmgw_runtime.api.usage import MAX_ENTRY_REQUESTS, MAX_ENTRY_TOKENS
from llmgw_runtime.security import hash_token
from llmgw_runtime.store import usage

from .conftest import ADMIN, ROUTER, Api, served
from .test_console import login

SHA = "ab" * 32
CATALOG = "models:\n" + "".join(
    f"  - {{name: {name}, source: /m.gguf, engine: llama.cpp, profile: {{class: cpu}}}}\n"
    for name in ("chat", "embed"))


@pytest.fixture
def catalog(api: Api) -> None:
    """The models the reports name are in the catalog (others are booked "(unknown)")."""
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200


def _entry(key: str, model: str = "chat", requests: int = 1, prompt: int = 10,
           completion: int = 5) -> dict[str, Any]:
    return {"key": key, "model": model, "requests": requests, "prompt_tokens": prompt,
            "completion_tokens": completion}


def _report(reporter: str, seq: int, *entries: dict[str, Any]) -> dict[str, Any]:
    return {"reporter": reporter, "seq": seq, "entries": list(entries)}


def _key(api: Api, name: str, **limits: Any) -> str:
    made = api.call("POST", "/api/v1/keys", json={"name": name, **limits})
    assert made.status_code == 201, made.json
    return hash_token(made.json["key"])


def _rows(api: Api, query: str = "") -> list[dict[str, Any]]:
    resp = api.call("GET", "/api/v1/usage" + query)
    assert resp.status_code == 200, resp.json
    return list(resp.json["rows"])


@pytest.mark.usefixtures("catalog")
def test_a_report_is_applied_once_and_stored_by_key_name(api: Api) -> None:
    app = _key(api, "app")
    report = _report("router-a-1", 1, _entry(app), _entry(app, "embed", 2, 30, 0),
                     _entry("-", prompt=3, completion=4), _entry(SHA, prompt=7, completion=1))
    first = api.call("POST", "/api/v1/usage", token=ROUTER, json=report)
    again = api.call("POST", "/api/v1/usage", token=ROUTER, json=report)
    assert (first.json, again.json) == ({"applied": True}, {"applied": False})
    assert _rows(api) == [
        {"key": "(deleted)", "model": "chat", "requests": 1, "prompt_tokens": 7,
         "completion_tokens": 1, "refused": 0},
        {"key": "-", "model": "chat", "requests": 1, "prompt_tokens": 3,
         "completion_tokens": 4, "refused": 0},
        {"key": "app", "model": "chat", "requests": 1, "prompt_tokens": 10,
         "completion_tokens": 5, "refused": 0},
        {"key": "app", "model": "embed", "requests": 2, "prompt_tokens": 30,
         "completion_tokens": 0, "refused": 0}]
    # an older report of the same reporter is a retry too; the next one counts
    assert api.call("POST", "/api/v1/usage", token=ROUTER,
                    json=_report("router-a-1", 1, _entry(app))).json == {"applied": False}
    assert api.call("POST", "/api/v1/usage", token=ROUTER,
                    json=_report("router-a-1", 2, _entry(app))).json == {"applied": True}
    assert _rows(api, "?by=key") == [
        {"key": "(deleted)", "requests": 1, "prompt_tokens": 7, "completion_tokens": 1,
         "refused": 0},
        {"key": "-", "requests": 1, "prompt_tokens": 3, "completion_tokens": 4, "refused": 0},
        {"key": "app", "requests": 4, "prompt_tokens": 50, "completion_tokens": 10, "refused": 0}]
    assert _rows(api, "?by=model") == [
        {"model": "chat", "requests": 4, "prompt_tokens": 30, "completion_tokens": 15,
         "refused": 0},
        {"model": "embed", "requests": 2, "prompt_tokens": 30, "completion_tokens": 0,
         "refused": 0}]


def test_the_same_report_sent_twice_at_once_counts_once(api: Api) -> None:
    """Two control workers handling one report at the same moment (a retry racing the
    first try): one applies it, the other answers applied: false."""
    app = _key(api, "app")
    applied: list[bool] = []
    with served(api.client.application) as url:
        for seq in range(1, 6):
            body = json.dumps(_report("router-race", seq, _entry(app))).encode()
            barrier = threading.Barrier(3)

            def post(data: bytes = body, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                resp = requests.post(url + "/api/v1/usage", data=data, timeout=30,
                                     headers={"Authorization": f"Bearer {ROUTER}",
                                              "Content-Type": "application/json"})
                assert resp.status_code == 200, resp.text
                applied.append(resp.json()["applied"])
            threads = [threading.Thread(target=post) for _ in range(3)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
    assert sorted(applied) == [False] * 10 + [True] * 5
    assert _rows(api)[0]["requests"] == 5


def test_usage_since_counts_from_the_start_of_that_hour(api: Api) -> None:
    with api.store.begin() as conn:
        now = api.store.now(conn)
        for hours_ago, n in ((0, 1), (5, 10), (30, 100)):
            usage.add_usage(conn, usage.bucket_of(now - hours_ago * 3600),
                            [usage.Used("app", "chat", n, n, n)])
    assert [r["requests"] for r in _rows(api, "?since=1h")] == [1]
    assert [r["requests"] for r in _rows(api, "?since=6h")] == [11]
    assert [r["requests"] for r in _rows(api)] == [11]          # 24h by default
    assert [r["requests"] for r in _rows(api, "?since=2d")] == [111]
    view = api.call("GET", "/api/v1/usage?since=6h").json
    assert view["since"] % 3600 == 0 and view["until"] - view["since"] < 7 * 3600


@pytest.mark.parametrize(("body", "says"), [
    (_report("r", 0, _entry("-")), "seq"),
    (_report("r", -1, _entry("-")), "seq"),
    (_report("r", 2**60, _entry("-")), "seq"),
    ({**_report("r", 1, _entry("-")), "seq": 1.5}, "seq"),
    ({**_report("r", 1, _entry("-")), "seq": "1"}, "seq"),
    ({**_report("r", 1, _entry("-")), "seq": True}, "seq"),
    (_report("", 1, _entry("-")), "reporter"),
    (_report("r" * 101, 1, _entry("-")), "reporter"),
    (_report("bad reporter", 1, _entry("-")), "reporter"),
    (_report("r\x1b[2J", 1, _entry("-")), "reporter"),
    (_report("r", 1), "entries"),
    (_report("r", 1, *[_entry("-", f"m{i}") for i in range(10_001)]), "entries"),
    (_report("r", 1, _entry("AB" * 32)), "key"),
    (_report("r", 1, _entry("sk-llmgw-the-key-itself")), "key"),
    (_report("r", 1, _entry("a" * 63)), "key"),
    (_report("r", 1, _entry("-", "no spaces")), "model"),
    (_report("r", 1, _entry("-", "m" * 201)), "model"),
    (_report("r", 1, _entry("-", requests=-1)), "requests"),
    (_report("r", 1, _entry("-", prompt=2**53 + 1)), "prompt_tokens"),
    (_report("r", 1, _entry("-", completion=1.0)), "completion_tokens"),   # type: ignore[arg-type]
    (_report("r", 1, {**_entry("-"), "refused": -1}), "refused"),
    (_report("r", 1, {**_entry("-"), "refused": 10**9 + 1}), "refused"),
    (_report("r", 1, {**_entry("-"), "refused": "3"}), "refused"),
    (_report("r", 1, {**_entry("-"), "refused": 1.5}), "refused"),
    (_report("r", 1, {**_entry("-"), "refused": [1]}), "refused"),
    (_report("r", 1, {**_entry("-"), "cost": 1}), "cost"),
    ({**_report("r", 1, _entry("-")), "extra": 1}, "extra"),
    ({"reporter": "r", "seq": 1}, "entries"),
])
def test_a_hostile_usage_report_is_refused_whole_naming_the_field(
        api: Api, body: dict[str, Any], says: str) -> None:
    resp = api.call("POST", "/api/v1/usage", token=ROUTER, json=body)
    assert resp.status_code == 400, resp.json
    assert says in json.dumps(resp.json["error"])
    assert _rows(api, "?since=1d") == []


def test_non_finite_and_deep_usage_reports_are_refused(api: Api) -> None:
    for raw in (b'{"reporter":"r","seq":NaN,"entries":[]}',
                b'{"reporter":"r","seq":1e999,"entries":[]}',
                b'{"reporter":"r","seq":1,"entries":' + b"[" * 100 + b"]" * 100 + b"}"):
        resp = api.call("POST", "/api/v1/usage", token=ROUTER, data=raw,
                        content_type="application/json")
        assert resp.status_code == 400, raw


def test_only_routers_report_usage_and_only_admins_read_it(api: Api) -> None:
    body = _report("r", 1, _entry("-"))
    assert api.call("POST", "/api/v1/usage", token=ADMIN, json=body).status_code == 403
    assert api.call("POST", "/api/v1/usage", token=None, json=body).status_code == 401
    assert api.call("GET", "/api/v1/usage", token=ROUTER).status_code == 403


@pytest.mark.parametrize("query", ["?since=soon", "?since=0", "?since=-5h", "?since=4000d",
                                   "?by=owner", "?by=key,model,x"])
def test_a_bad_usage_query_is_refused_naming_it(api: Api, query: str) -> None:
    resp = api.call("GET", "/api/v1/usage" + query)
    assert resp.status_code == 400
    assert query[1:].split("=")[0] in resp.json["error"]["message"]


@pytest.mark.usefixtures("catalog")
def test_metrics_count_tokens_per_key_name_and_model(api: Api) -> None:
    app = _key(api, "app")
    for seq in (1, 2):
        api.call("POST", "/api/v1/usage", token=ROUTER,
                 json=_report("r", seq, _entry(app, prompt=10, completion=5)))
    text = api.call("GET", "/metrics").get_data(as_text=True)
    assert "# TYPE llmgw_key_tokens_total counter" in text
    assert 'llmgw_key_requests_total{key="app",model="chat"} 2.0' in text
    assert 'llmgw_key_tokens_total{key="app",model="chat",kind="prompt"} 20.0' in text
    assert 'llmgw_key_tokens_total{key="app",model="chat",kind="completion"} 10.0' in text
    assert app not in text          # names, never hashes


@pytest.mark.usefixtures("catalog")
def test_refusals_are_counted_per_key_name_in_the_api_and_metrics(api: Api) -> None:
    """Issue 29: a router's refusals of a key's requests (UsageEntry.refused) are stored
    under the key's name, summed per hour and since the store began, read back by
    GET /api/v1/usage and /metrics' llmgw_usage_refused_total; a report of an older router
    (no ``refused``) still applies, counting none."""
    app = _key(api, "app", rpm=1)
    older = _entry(app)
    assert "refused" not in older
    for seq, entry in ((1, {**_entry(app, requests=0, prompt=0, completion=0), "refused": 3}),
                       (2, {**_entry(app, "(unknown)", 0, 0, 0), "refused": 2}),
                       (3, older)):
        resp = api.call("POST", "/api/v1/usage", token=ROUTER, json=_report("r", seq, entry))
        assert resp.json == {"applied": True}, resp.json
    assert _rows(api, "?by=key") == [{"key": "app", "requests": 1, "prompt_tokens": 10,
                                      "completion_tokens": 5, "refused": 5}]
    text = api.call("GET", "/metrics").get_data(as_text=True)
    assert "# TYPE llmgw_usage_refused_total counter" in text
    assert 'llmgw_usage_refused_total{key="app",model="chat"} 3.0' in text
    assert 'llmgw_usage_refused_total{key="app",model="(unknown)"} 2.0' in text
    assert app not in text


@pytest.mark.usefixtures("catalog")
def test_the_console_shows_usage_per_key_and_model(api: Api) -> None:
    app = _key(api, "app")
    api.call("POST", "/api/v1/usage", token=ROUTER,
             json=_report("r", 1, {**_entry(app, "chat", 3, 120, 45), "refused": 7}))
    assert api.client.get("/console/usage").status_code in (302, 303)
    login(api)
    html = api.client.get("/console/usage?since=7d").get_data(as_text=True)
    assert '<table id="usage">' in html and "<b>7d</b>" in html
    row = html.split('<table id="usage">')[1]
    for cell in ("<td>app</td>", "<td>chat</td>", '<td class="num">3</td>',
                 '<td class="num">120</td>', '<td class="num">45</td>',
                 '<td class="num">165</td>', '<td class="num">7</td>'):
        assert cell in row
    by_key = html.split('<table id="usage-keys">')[1].split("</table>")[0]
    assert ">Refused</th>" in by_key and '<td class="num">7</td>' in by_key  # issue 29
    assert 'href="/console/usage"' in html          # in the navigation


def test_key_limits_are_kept_listed_changed_and_carried_to_routers(api: Api) -> None:
    app = _key(api, "app", rpm=60, tpm=10_000)
    _key(api, "free")
    [listed] = [k for k in api.call("GET", "/api/v1/keys").json["keys"] if k["name"] == "app"]
    assert (listed["rpm"], listed["tpm"]) == (60, 10_000)
    routes = api.call("GET", "/api/v1/routes", token=ROUTER).json
    assert routes["key_limits"] == {app: {"name": "app", "rpm": 60, "tpm": 10_000}}
    changed = api.call("PATCH", "/api/v1/keys/app", json={"rpm": "none", "tpm": 500})
    assert (changed.json["rpm"], changed.json["tpm"]) == (None, 500)
    assert api.call("GET", "/api/v1/routes", token=ROUTER).json["key_limits"] == {
        app: {"name": "app", "rpm": None, "tpm": 500}}
    api.call("PATCH", "/api/v1/keys/app", json={"tpm": "none"})
    assert api.call("GET", "/api/v1/routes", token=ROUTER).json["key_limits"] == {}
    messages = [e["message"] for e in api.call("GET", "/api/v1/events").json["events"]]
    assert any(m.startswith("API key created at most 60 requests and 10000 tokens per "
                            "minute") for m in messages), messages
    assert any(m.startswith("API key limit requests per minute 60 -> none by")
               for m in messages)
    assert any(m.startswith("API key limit tokens per minute 10000 -> 500 by")
               for m in messages)


@pytest.mark.parametrize(("method", "body", "says"), [
    ("POST", {"name": "k2", "rpm": 0}, "rpm"),
    ("POST", {"name": "k2", "rpm": -1}, "rpm"),
    ("POST", {"name": "k2", "rpm": 1.5}, "rpm"),
    ("POST", {"name": "k2", "rpm": "60"}, "rpm"),
    ("POST", {"name": "k2", "rpm": True}, "rpm"),
    ("POST", {"name": "k2", "rpm": 1_000_001}, "rpm"),
    ("POST", {"name": "k2", "tpm": 10**11}, "tpm"),
    ("POST", {"name": "k2", "tpm": "none"}, "tpm"),
    ("PATCH", {"rpm": "unlimited"}, "rpm"),
    ("PATCH", {"tpm": 0}, "tpm"),
    ("PATCH", {"tpm": [5]}, "tpm"),
])
def test_bad_limits_are_refused_naming_the_field(api: Api, method: str,
                                                 body: dict[str, Any], says: str) -> None:
    _key(api, "k")
    path = "/api/v1/keys" if method == "POST" else "/api/v1/keys/k"
    resp = api.call(method, path, json=body)
    assert resp.status_code == 400, resp.json
    assert says in json.dumps(resp.json["error"])
    [key] = api.call("GET", "/api/v1/keys").json["keys"]
    assert (key["rpm"], key["tpm"]) == (None, None)


@pytest.mark.usefixtures("catalog")
def test_models_outside_the_catalog_are_booked_under_one_label(api: Api) -> None:
    """Issue 28: made-up model names in a router's report do not become series of their own
    in /metrics (nor rows of the usage API): they are booked as "(unknown)"."""
    made_up = [_entry("-", f"made-up-{i}", 1, 2, 3) for i in range(50)]
    resp = api.call("POST", "/api/v1/usage", token=ROUTER,
                    json=_report("r", 1, _entry("-", "chat"), *made_up))
    assert resp.status_code == 200, resp.json
    assert _rows(api, "?by=model") == [
        {"model": "(unknown)", "requests": 50, "prompt_tokens": 100, "completion_tokens": 150,
         "refused": 0},
        {"model": "chat", "requests": 1, "prompt_tokens": 10, "completion_tokens": 5, "refused": 0}]
    text = api.call("GET", "/metrics").get_data(as_text=True)
    assert 'llmgw_key_requests_total{key="-",model="(unknown)"} 50.0' in text
    assert "made-up" not in text


@pytest.mark.usefixtures("catalog")
def test_huge_counts_are_refused_per_entry_and_saturate_when_summed(api: Api) -> None:
    """Issue 28: 1,100 entries of 2^53 were a 500 (an OverflowError into the store): each
    entry is bounded (400 naming the field), and sums stop at 2^53."""
    huge = _report("r", 1, *[_entry("-", prompt=2**53, completion=2**53)] * 1_100)
    resp = api.call("POST", "/api/v1/usage", token=ROUTER, json=huge)
    assert resp.status_code == 400, resp.json
    assert "prompt_tokens" in json.dumps(resp.json["error"])
    most = _entry("-", requests=MAX_ENTRY_REQUESTS, prompt=MAX_ENTRY_TOKENS,
                  completion=MAX_ENTRY_TOKENS)
    for seq in range(1, 11):          # 10,000 entries at the bound: past 2^53 in all
        resp = api.call("POST", "/api/v1/usage", token=ROUTER,
                        json=_report("r", seq, *[most] * 1_000))
        assert resp.status_code == 200, resp.json
    assert _rows(api, "?by=model") == [
        {"model": "chat", "requests": 10**13, "prompt_tokens": 2**53,
         "completion_tokens": 2**53, "refused": 0}]
    assert 'model="chat",kind="prompt"} 9.007199254740992e+15' in api.call(
        "GET", "/metrics").get_data(as_text=True)
