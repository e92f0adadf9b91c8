"""The admin API of rollouts and node drains, through the real control service: what an
operator's ``ctl rollout`` and ``ctl nodes cordon/drain`` get back, the events that name
who did it, and the refusals that name the fix (issue 27)."""

from __future__ import annotations

from typing import Any

from .conftest import ADMIN, ROUTER, Api

TINY = """models:
  - {name: tiny, source: /m/tiny.gguf, engine: llama.cpp, profile: {class: cpu}%s}
"""
GPU = {"id": 0, "uuid": "GPU-0", "card": 0, "mig": None, "class": "l4-24g",
       "memory_total_mb": 23034, "memory_used_mb": 0, "healthy": True, "reason": None}
BIG = """models:
  - {name: big, source: /m/big.gguf, engine: llama.cpp, profile: {class: l4-24g}}
"""


def put(api: Api, text: str, dry: bool = False) -> dict[str, Any]:
    resp = api.call("PUT", "/api/v1/catalog" + ("/dry-run" if dry else ""), data=text,
                    headers={"Content-Type": "application/yaml"})
    assert resp.status_code == 200, resp.json
    return dict(resp.json)


def running(api: Api, catalog: str, node: str = "n1", devices: Any = None) -> tuple[str, str]:
    """``catalog`` applied and its one replica ready on ``node``: (credential, replica)."""
    cred = api.join(node)
    api.report(cred, node, devices=devices)
    put(api, catalog)
    api.reconciler.run_cycle()
    (assigned,) = api.report(cred, node, devices=devices).json["assignments"]
    rid = assigned["replica_id"]
    ready = [{"id": rid, "state": "ready", "port": 4000, "pid": 9}]
    assert api.report(cred, node, devices=devices, replicas=ready).status_code == 200
    return cred, rid


def events(api: Api) -> list[str]:
    return [f"{e['kind']} {e['subject']}: {e['message']}"
            for e in api.call("GET", "/api/v1/events").json["events"]]


def test_a_model_without_a_rollout_says_none_and_an_unknown_one_is_404(api: Api) -> None:
    put(api, TINY % "")
    resp = api.call("GET", "/api/v1/models/tiny/rollout")
    assert resp.status_code == 200, resp.json
    assert resp.json["model"] == "tiny" and resp.json["state"] == "none"
    assert len(resp.json["definition"]) == 12
    resp = api.call("GET", "/api/v1/models/nope/rollout")
    assert resp.status_code == 404 and "nope" in resp.json["error"]["message"]


def test_a_new_definition_rolls_and_apply_and_dry_run_say_so(api: Api) -> None:
    running(api, TINY % "")
    changed = TINY % ", args: [--ctx-size, '4096']"
    dry = put(api, changed, dry=True)
    assert dry["rolls"] == ["tiny"] and dry["dry_run"] is True
    result = put(api, changed)
    assert result["updated"] == ["tiny"] and result["rolls"] == ["tiny"]
    status = api.call("GET", "/api/v1/models/tiny/rollout").json
    assert status["state"] == "rolling"
    assert (status["old_total"], status["old_ready"], status["wanted"]) == (1, 1, 1)
    assert status["previous"] and status["previous"] != status["definition"]
    # the same catalog again: nothing changes, nothing rolls
    assert put(api, changed)["rolls"] == []
    # the old replica is marked in the listing
    (rep,) = api.call("GET", "/api/v1/replicas").json["replicas"]
    assert rep["current"] is False and rep["draining"] is None


def test_undo_goes_back_to_the_previous_definition_and_names_who(api: Api) -> None:
    running(api, TINY % "")
    before = api.call("GET", "/api/v1/models/tiny").json["definition_hash"]
    put(api, TINY % ", args: [--ctx-size, '4096']")
    resp = api.call("POST", "/api/v1/models/tiny/rollout/undo")
    assert resp.status_code == 200, resp.json
    assert before.startswith(resp.json["definition"])
    assert api.call("GET", "/api/v1/models/tiny").json["definition_hash"] == before
    assert any("admin" in line for line in events(api) if line.startswith("rollout tiny"))


def test_undo_without_a_previous_definition_and_promote_without_a_canary_are_409(
        api: Api) -> None:
    put(api, TINY % "")
    resp = api.call("POST", "/api/v1/models/tiny/rollout/undo")
    assert resp.status_code == 409 and "tiny" in resp.json["error"]["message"]
    resp = api.call("POST", "/api/v1/models/tiny/rollout/promote")
    assert resp.status_code == 409 and "canary" in resp.json["error"]["message"]
    assert api.call("POST", "/api/v1/models/nope/rollout/undo").status_code == 404


def test_a_canary_is_promoted(api: Api) -> None:
    running(api, TINY % "")
    put(api, TINY % ", args: [--ctx-size, '4096'], rollout: {canary_percent: 10}")
    status = api.call("GET", "/api/v1/models/tiny/rollout").json
    assert status["state"] == "canary" and status["canary_percent"] == 10
    resp = api.call("POST", "/api/v1/models/tiny/rollout/promote")
    assert resp.status_code == 200, resp.json
    assert resp.json["state"] == "rolling"
    assert any("admin" in line for line in events(api) if "promot" in line)


def test_cordon_and_uncordon_show_in_the_node_listing_with_who_did_it(api: Api) -> None:
    cred = api.join("n1")
    api.report(cred, "n1")
    resp = api.call("POST", "/api/v1/nodes/n1/cordon")
    assert resp.status_code == 200, resp.json
    assert resp.json["node"] == "n1" and resp.json["cordoned"] is True
    assert resp.json["draining"] is False
    (node,) = api.call("GET", "/api/v1/nodes").json["nodes"]
    assert node["cordoned"] is True and node["draining"] is False
    assert any(line.startswith("node n1") and "admin" in line and "cordon" in line
               for line in events(api))
    resp = api.call("POST", "/api/v1/nodes/n1/uncordon")
    assert resp.status_code == 200 and resp.json["cordoned"] is False
    assert api.call("GET", "/api/v1/nodes").json["nodes"][0]["cordoned"] is False
    assert api.call("POST", "/api/v1/nodes/nope/cordon").status_code == 404


def test_a_drain_without_room_names_the_models_and_force(api: Api) -> None:
    running(api, BIG, devices=[GPU])
    resp = api.call("POST", "/api/v1/nodes/n1/drain", json={})
    assert resp.status_code == 409, resp.json
    message = resp.json["error"]["message"]
    assert "big" in message and "--force" in message
    assert api.call("GET", "/api/v1/nodes").json["nodes"][0]["cordoned"] is False
    resp = api.call("POST", "/api/v1/nodes/n1/drain", json={"force": True})
    assert resp.status_code == 200, resp.json
    assert (resp.json["cordoned"], resp.json["draining"], resp.json["done"]) == (
        True, True, False)
    assert resp.json["total"] == 1
    status = api.call("GET", "/api/v1/nodes/n1/drain")
    assert status.status_code == 200 and status.json["node"] == "n1"
    assert status.json["draining"] is True


def test_an_empty_node_drains_at_once_and_a_bad_body_names_the_field(api: Api) -> None:
    cred = api.join("n1")
    api.report(cred, "n1")
    for body, says in (({"force": "yes"}, "force"), ({"forse": True}, "forse"),
                       ([], "drain request")):
        resp = api.call("POST", "/api/v1/nodes/n1/drain", json=body)
        assert resp.status_code == 400 and says in str(resp.json), (body, resp.json)
    resp = api.call("POST", "/api/v1/nodes/n1/drain")      # no body: {}
    assert resp.status_code == 200, resp.json
    assert resp.json["cordoned"] is True and resp.json["total"] == 0
    assert api.call("GET", "/api/v1/nodes/nope/drain").status_code == 404


def test_the_rollout_and_drain_routes_want_an_admin_token(api: Api) -> None:
    put(api, TINY % "")
    for method, path in (("GET", "/api/v1/models/tiny/rollout"),
                         ("POST", "/api/v1/models/tiny/rollout/undo"),
                         ("POST", "/api/v1/models/tiny/rollout/promote"),
                         ("POST", "/api/v1/nodes/n1/cordon"),
                         ("POST", "/api/v1/nodes/n1/uncordon"),
                         ("POST", "/api/v1/nodes/n1/drain"),
                         ("GET", "/api/v1/nodes/n1/drain")):
        assert api.call(method, path, None).status_code == 401, path
        assert api.call(method, path, ROUTER).status_code == 403, path
        assert api.call(method, path, ADMIN).status_code != 401
