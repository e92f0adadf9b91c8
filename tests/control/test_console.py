"""The web console through Flask's test client, on both store backends: login, the session
cookie, CSRF on retry, and server-rendered pages that carry the data without JavaScript."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from typing import Any

import pytest
import sqlalchemy as sa

from llmgw_runtime.control.app import create_app
from llmgw_runtime.security import hash_token
from llmgw_runtime.store import repo
from llmgw_runtime.store.schema import console_sessions, nodes

from .conftest import ADMIN, ROUTER, Api

CATALOG = """models:
  - {name: tiny, source: file:///models/tiny.gguf, engine: llama.cpp, profile: {class: cpu}}
  - {name: big, source: file:///models/big.gguf, engine: vllm, profile: {class: h100-80g}}
  - {name: small, source: file:///models/s.gguf, engine: vllm,
     profile: {class: a100-80g-mig-3g.40gb}}
"""
MIG = {"id": 1001, "uuid": "MIG-1234", "card": 0, "mig": 1, "class": "a100-80g-mig-3g.40gb",
       "memory_total_mb": 40960, "memory_used_mb": 2048, "healthy": True, "reason": None}
OOM = "engine exited: CUDA out of memory while loading <weights> & friends"
PAGES = ["/console/", "/console/nodes", "/console/models", "/console/replicas",
         "/console/events"]


@pytest.fixture
def fleet(api: Api) -> Api:
    """A parked model (tiny), an unplaceable one (big), a node with a MIG instance and a
    ready replica on it that no router has reported (idle unknown)."""
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    api.report(api.join("gpu1"), "gpu1", devices=[MIG])
    with api.store.begin() as conn:
        repo.update_model(conn, "tiny", parked=1, consecutive_failures=5, last_error=OOM)
        repo.update_model(conn, "big", placement_reason="no node has a free h100-80g")
        repo.add_replica(conn, "small-1", "small", "gpu1", (1001,), time.time() - 60)
        repo.update_replica(conn, "small-1", state="ready", port=41000)
    return api


def login(api: Api, token: str = ADMIN, **kw: Any) -> Any:
    return api.client.post("/console/login", data={"token": token}, **kw)


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found, "no csrf field on the page"
    return found.group(1)


def model(api: Api, name: str) -> dict[str, Any]:
    return dict(api.call("GET", f"/api/v1/models/{name}").json)


def test_every_page_needs_a_login(fleet: Api) -> None:
    root = fleet.client.get("/")
    assert root.status_code == 302 and root.location.endswith("/console/")
    for path in PAGES:
        resp = fleet.client.get(path)
        assert resp.status_code == 303, path
        assert resp.location.startswith("/console/login"), resp.location
    assert "next=%2Fconsole%2Fnodes" in fleet.client.get("/console/nodes").location
    resp = fleet.client.post("/console/models/tiny/retry", data={"csrf": "x"})
    assert resp.status_code == 303 and model(fleet, "tiny")["parked"]


def test_a_wrong_token_is_refused_clearly_and_never_logged(
        fleet: Api, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    resp = login(fleet, "llmgw-admin-wrong-secret")
    html = resp.get_data(as_text=True)
    assert resp.status_code == 401 and "Login refused" in html
    assert "matches no account" in html and "LLMGW_ADMIN_TOKEN" in html
    # where `make up` keeps the token, said in the refusal itself (issue 28)
    refusal = html.split("Login refused:", 1)[1].split("</p>", 1)[0]
    assert ".llmgw/secrets/admin-token" in refusal, refusal
    assert "Set-Cookie" not in resp.headers
    router = login(fleet, ROUTER)
    assert router.status_code == 401
    assert "that is a router token; the console needs an admin token" in router.get_data(
        as_text=True)
    assert login(fleet, "").status_code == 401
    assert "wrong-secret" not in caplog.text and ROUTER not in caplog.text
    assert "console login refused" in caplog.text


def test_login_sets_an_httponly_samesite_strict_cookie_and_stores_only_its_hash(
        fleet: Api) -> None:
    resp = login(fleet, ADMIN + "  ")                 # pasted with a trailing space
    assert resp.status_code == 303 and resp.location == "/console/"
    cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith("llmgw_console=")
    for flag in ("HttpOnly", "SameSite=Strict", "Path=/console", "Max-Age=43200"):
        assert flag in cookie, cookie
    assert "Secure" not in cookie                      # plain HTTP: the cookie would be lost
    raw = cookie.split(";")[0].split("=", 1)[1]
    with fleet.store.begin() as conn:
        rows = list(conn.execute(sa.select(console_sessions)))
    assert [r.id_hash for r in rows] == [hash_token(raw)] and rows[0].account == "admin"
    assert fleet.client.get("/console/").status_code == 200
    assert fleet.client.get("/console/login").location == "/console/"   # already in
    https = login(fleet, base_url="https://console.example")
    assert "Secure" in https.headers["Set-Cookie"]


def test_login_goes_back_to_the_page_asked_for_and_never_off_site(fleet: Api) -> None:
    resp = fleet.client.post("/console/login?next=/console/events",
                             data={"token": ADMIN})
    assert resp.location == "/console/events"
    for bad in ("https://evil.example/console/", "//evil.example/console", "/api/v1/models"):
        resp = fleet.client.post("/console/login", data={"token": ADMIN, "next": bad})
        assert resp.location == "/console/", bad


@pytest.mark.parametrize("bad", [
    "/console/nodes\nSet-Cookie: x=1", "/console/\r\nLocation: https://evil.example",
    "/console/\x00", "/console/\x7f", "/console/\x85", "/console/\x1b[2J", "http://[",
    "//[::1", "\n"])
def test_a_bad_next_target_goes_home_never_a_500(fleet: Api, bad: str) -> None:
    page = fleet.client.get("/console/login", query_string={"next": bad})
    assert page.status_code == 200
    assert 'name="next" value="/console/"' in page.get_data(as_text=True)
    resp = fleet.client.post("/console/login", data={"token": ADMIN, "next": bad})
    assert resp.status_code == 303 and resp.location == "/console/", repr(bad)
    again = fleet.client.get("/console/login", query_string={"next": bad})
    assert again.status_code == 302 and again.location == "/console/"


def test_retry_without_the_right_csrf_token_is_refused_and_changes_nothing(
        fleet: Api) -> None:
    login(fleet)
    token = csrf_of(fleet.client.get("/console/models").get_data(as_text=True))
    missing = fleet.client.post("/console/models/tiny/retry", data={})
    assert missing.status_code == 403
    assert "security token (csrf) is missing" in missing.get_data(as_text=True)
    wrong = fleet.client.post("/console/models/tiny/retry", data={"csrf": token[:-2] + "xx"})
    assert wrong.status_code == 403
    assert "does not match your session" in wrong.get_data(as_text=True)
    foreign = fleet.client.post("/console/models/tiny/retry", data={"csrf": token},
                                headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 403 and "evil.example" in foreign.get_data(as_text=True)
    referer = fleet.client.post("/console/models/tiny/retry", data={"csrf": token},
                                headers={"Referer": "https://evil.example/page"})
    assert referer.status_code == 403
    after = model(fleet, "tiny")
    assert after["parked"] and after["consecutive_failures"] == 5
    with fleet.store.begin() as conn:
        assert not [e for e in repo.list_events(conn) if e["kind"] == "retry"]


def test_retry_with_the_session_csrf_token_unparks_and_names_the_user(fleet: Api) -> None:
    login(fleet)
    html = fleet.client.get("/console/models").get_data(as_text=True)
    assert 'action="/console/models/tiny/retry"' in html
    assert html.count(">Retry</button>") == 1          # only the parked model has one
    resp = fleet.client.post("/console/models/tiny/retry", data={"csrf": csrf_of(html)},
                             headers={"Origin": "http://localhost"})
    assert resp.status_code == 303 and resp.location == "/console/models?retried=tiny"
    page = fleet.client.get(resp.location).get_data(as_text=True)
    assert "Model tiny was unparked" in page
    after = model(fleet, "tiny")
    assert not after["parked"] and after["consecutive_failures"] == 0
    assert after["state"] != "parked"
    with fleet.store.begin() as conn:
        events = repo.list_events(conn)
    assert events[0]["kind"] == "retry" and events[0]["subject"] == "tiny"
    assert events[0]["message"] == "unparked by admin (console)"
    assert "unparked by admin (console)" in fleet.client.get("/console/events").get_data(
        as_text=True)
    unknown = fleet.client.post("/console/models/nope/retry", data={"csrf": csrf_of(html)})
    assert unknown.status_code == 404
    assert "model &#39;nope&#39; is not in the catalog" in unknown.get_data(as_text=True)


def test_pages_are_server_rendered_with_mig_ids_and_unknown_idle_time(fleet: Api) -> None:
    login(fleet)
    pages = {p: fleet.client.get(p) for p in PAGES}
    for path, resp in pages.items():
        html = resp.get_data(as_text=True)
        assert resp.status_code == 200, path
        assert "<script" not in html, path                 # readable without JavaScript
        assert '<meta http-equiv="refresh" content="10; url=' in html, path
        assert resp.headers["Cache-Control"] == "no-store"
        assert "frame-ancestors 'none'" in resp.headers["Content-Security-Policy"]
    nodes_html = pages["/console/nodes"].get_data(as_text=True)
    assert "gpu1" in nodes_html and '<td class="dev">0/mig1</td>' in nodes_html
    assert "a100-80g-mig-3g.40gb" in nodes_html and "2.0/40.0" in nodes_html
    replicas_html = pages["/console/replicas"].get_data(as_text=True)
    row = replicas_html.split('id="replica-small-1"')[1].split("</tr>")[0]
    assert "gpu1:0/mig1" in row and '<td class="num idle">-</td>' in row and "ready" in row
    models_html = pages["/console/models"].get_data(as_text=True)
    assert "CUDA out of memory while loading &lt;weights&gt; &amp; friends" in models_html
    assert "<weights>" not in models_html                  # escaped
    events_html = pages["/console/events"].get_data(as_text=True)
    assert "model created" in events_html


def test_summary_shows_parked_and_unplaceable_models_with_their_reasons(fleet: Api) -> None:
    login(fleet)
    html = fleet.client.get("/console/").get_data(as_text=True)
    parked = html.split('id="parked"')[1].split("</table>")[0]
    assert "tiny" in parked and "CUDA out of memory" in parked and ">5<" in parked
    assert ">Retry</button>" in parked
    unplaceable = html.split('id="unplaceable"')[1].split("</table>")[0]
    assert "big" in unplaceable and "no node has a free h100-80g" in unplaceable
    devices = html.split('id="devices"')[1].split("</table>")[0]
    assert "a100-80g-mig-3g.40gb" in devices and 'class="used" style="width: 100.00%"' in devices
    assert "gpu1:0/mig1" in html.split('id="idle"')[1]    # unknown idle, listed apart
    assert "1/1 nodes reporting" in re.sub(r"<[^>]+>", "", html)


def test_logout_ends_the_session_everywhere(fleet: Api) -> None:
    raw = login(fleet).headers["Set-Cookie"].split(";")[0].split("=", 1)[1]
    html = fleet.client.get("/console/").get_data(as_text=True)
    refused = fleet.client.post("/console/logout", data={})
    assert refused.status_code == 403
    resp = fleet.client.post("/console/logout", data={"csrf": csrf_of(html)})
    assert resp.status_code == 303 and resp.location == "/console/login?out=1"
    assert "llmgw_console=;" in resp.headers["Set-Cookie"]
    # the old cookie, replayed (another worker, a copied cookie), is worth nothing now
    fleet.client.set_cookie("llmgw_console", raw, path="/console")
    again = fleet.client.get("/console/")
    assert again.status_code == 303 and "ended=1" in again.location
    with fleet.store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(console_sessions)
                            ).scalar_one() == 0


def test_an_expired_session_sends_you_to_login_saying_why(api: Api) -> None:
    config = dataclasses.replace(api.config, console_session_s=1.0)
    client = create_app(config, store_=api.store).test_client()
    client.post("/console/login", data={"token": ADMIN})
    assert client.get("/console/").status_code == 200
    time.sleep(1.1)
    resp = client.get("/console/events")
    assert resp.status_code == 303 and "ended=1" in resp.location
    page = client.get(resp.location).get_data(as_text=True)
    assert "Your session ended" in page


def test_two_thousand_nodes_render_a_page_at_a_time(api: Api) -> None:
    devices = json.dumps([{**MIG, "id": 1000 + i, "mig": i, "uuid": f"MIG-{i}"}
                          for i in range(8)])
    now = time.time()
    with api.store.begin() as conn:
        conn.execute(nodes.insert(), [
            {"name": f"gpu{i:04d}", "fabric": f"ib{i // 500}", "devices": devices,
             "engines": "[]", "weights": "{}", "hardware": "{}", "created": now,
             "last_report": now} for i in range(2000)])
    login(api)
    first = api.client.get("/console/nodes").get_data(as_text=True)
    last = api.client.get("/console/nodes?page=10").get_data(as_text=True)
    summary = api.client.get("/console/").get_data(as_text=True)
    assert first.count('<tbody class="node') == 200 and "1–200 of 2000" in first
    assert "gpu0199" in first and "gpu0200" not in first
    assert "gpu1999" in last and "1801–2000 of 2000" in last
    assert "2000</b>/2000 nodes reporting" in summary
    filtered = api.client.get("/console/nodes?q=gpu19").get_data(as_text=True)
    assert filtered.count('<tbody class="node') == 100


def test_summary_shows_store_members_and_a_missing_leader(
        fleet: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmgw_runtime.control import console

    def replicated() -> dict[str, Any]:
        return {"backend": "postgresql", "members": [
            {"name": "db1", "role": "replica", "state": "streaming", "lag_bytes": 2048,
             "missing": False, "problem": None},
            {"name": "db2", "role": "leader", "state": None, "lag_bytes": None,
             "missing": True, "problem": None}]}

    monkeypatch.setattr(console, "store_health", replicated)
    login(fleet)
    html = fleet.client.get("/console/").get_data(as_text=True)
    table = html.split('id="store"')[1].split("</table>")[0]
    assert "db1" in table and "streaming" in table and "2.0 KB" in table
    assert "missing" in table and "its REST API does not answer" in table
    assert "2 members" in html and "no leader" in html


def test_a_cpu_shared_by_two_replicas_shows_memory_free_and_one_idle_device(
        fleet: Api) -> None:
    """`llmgw up` with a second CPU model: the summary does not say the CPU is full (0 free,
    a full bar) while more replicas still fit, and two idle replicas hold one device."""
    fleet.report(fleet.join("cpu1"), "cpu1")            # the CPU: 16,000 MB, 1,000 used
    with fleet.store.begin() as conn:
        for rid in ("tiny-1", "tiny-2"):
            repo.add_replica(conn, rid, "tiny", "cpu1", (0,), time.time() - 7200)
            repo.update_replica(conn, rid, state="ready", port=41001,
                                last_used=time.time() - 3600)
    login(fleet)
    html = fleet.client.get("/console/").get_data(as_text=True)
    row = html.split('id="class-cpu"')[1].split("</tr>")[0]
    cells = re.findall(r'<td class="num">([^<]*)</td>', row)
    assert cells[:3] == ["1", "1.0 GB", "14.6 GB"], row          # used, free: memory
    assert 'class="used" style="width: 6.25%"' in row             # not a full bar
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))
    assert "cpu is shared: 2 replicas on 1 device; used and free are memory" in text
    assert "holding 1 device;" in text or "holding 1 device." in text


def test_a_long_error_on_the_events_page_is_folded_to_its_telling_line(fleet: Api) -> None:
    message = ("start failed: exited with 1; last log lines:\nloading model\n"
               "error: unknown argument: --bogus\nusage: llama-server [options]")
    with fleet.store.begin() as conn:
        repo.add_event(conn, time.time(), "failed", "tiny", message)
        repo.add_event(conn, time.time(), "note", "tiny", "short and plain")
    login(fleet)
    html = fleet.client.get("/console/events").get_data(as_text=True)
    folded = re.search(r'<details class="fold"><summary[^>]*>([^<]*)</summary><pre>([^<]*)</pre>',
                       html)
    assert folded, html
    assert folded.group(1) == "start failed: exited with 1: error: unknown argument: --bogus"
    assert folded.group(2) == message                      # the whole text, unfolded on click
    assert re.search(r'<td class="message">\s*short and plain\s*</td>', html)


def test_pages_show_rollouts_draining_replicas_and_nodes_out_of_placement(fleet: Api) -> None:
    """small rolls (its replica runs an old definition), a second replica drains, and
    gpu1 is cordoned: the summary, models, replicas and nodes pages say so (issue 27)."""
    now = time.time()
    with fleet.store.begin() as conn:
        repo.update_model(conn, "small", rollout_state=json.dumps(
            {"state": "failed", "since": now - 90, "error": "wrong magic number"}))
        repo.update_replica(conn, "small-1", definition_hash="0" * 64)
        repo.add_replica(conn, "small-2", "small", "gpu1", (1001,), now - 30)
        repo.update_replica(conn, "small-2", state="ready", port=41001, drain_since=now - 5,
                            drain_reason="rollout", drain_timeout_s=45.0,
                            in_flight=json.dumps({"router-1/1": [2, now - 1]}))
        conn.execute(nodes.update().where(nodes.c.name == "gpu1").values(cordoned=1))
    login(fleet)
    summary = fleet.client.get("/console/").get_data(as_text=True)
    assert "1 cordoned" in summary and "(1 draining)" in summary
    row = summary.split('id="rollout-small"')[1].split("</tr>")[0]
    assert "rollout failed: wrong magic number" in row
    held = summary.split('id="held-gpu1"')[1].split("</tr>")[0]
    assert "cordoned" in held
    models_html = fleet.client.get("/console/models").get_data(as_text=True)
    row = models_html.split('id="model-small"')[1].split("</tr>")[0]
    assert "rollout failed: wrong magic number" in row
    replicas_html = fleet.client.get("/console/replicas").get_data(as_text=True)
    row = replicas_html.split('id="replica-small-2"')[1].split("</tr>")[0]
    assert re.search(r"draining \(2 in flight, 4\d s left\)", row), row
    row = replicas_html.split('id="replica-small-1"')[1].split("</tr>")[0]
    assert "ready, old definition" in row
    nodes_html = fleet.client.get("/console/nodes").get_data(as_text=True)
    assert re.search(r'gpu1 <span class="held"[^>]*>cordoned</span>', nodes_html)


def test_a_failing_model_says_failing_with_its_last_error_in_the_console_and_status(
        fleet: Api) -> None:
    # Issue 28: a failing model showed `starting`, its reason there one poll and not the
    # next. The console and the summary (ctl status, llmgw-status) say the same.
    with fleet.store.begin() as conn:
        repo.update_model(conn, "tiny", parked=0, consecutive_failures=3,
                          last_failure_at=time.time(), last_error=OOM)
    status = fleet.call("GET", "/api/v1/status").json
    failing = next(m for m in status["models"] if m["name"] == "tiny")["failing"]
    assert re.fullmatch(r"failing \(3 in a row, next start in (19|20) s\)", failing["text"])
    assert failing["last_error"] == OOM
    login(fleet)
    html = fleet.client.get("/console/models").get_data(as_text=True)
    row = html.split('id="model-tiny"')[1].split("</tr>")[0]
    assert 'class="state state-failing">failing (3 in a row, next start in' in row, row
    assert "CUDA out of memory" in row
    html = fleet.client.get("/console/").get_data(as_text=True)
    row = html.split('id="summary-model-tiny"')[1].split("</tr>")[0]
    assert 'class="state-failing">failing (3 in a row, next start in' in row, row
    assert "CUDA out of memory" in row
