"""``ctl apply`` rolling a model, ``ctl rollout``, and ``ctl nodes cordon/uncordon/drain``
against a real control service (the reconciler run in the test): what an operator types
and reads (issue 27)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from llmgw_runtime.api.agent import Report
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.control.reconcile import Reconciler
from llmgw_runtime.security import hash_token
from llmgw_runtime.store import Store, repo
from tests.cli.test_commands import control, ctl  # noqa: F401 - the fixture
from tests.control.conftest import ADMIN, CPU, JOIN, ROUTER

TINY = """models:
  - {name: tiny, source: file:///models/tiny.gguf, engine: llama.cpp, profile: {class: cpu}%s}
"""


def put_node(store: Store, name: str) -> None:
    """A node with the CPU and llama.cpp that reported a second ago."""
    with store.begin() as conn:
        repo.set_node_credential(conn, name, hash_token("cred-" + name), time.time())
        repo.record_report(conn, name, Report.model_validate(
            {"node": name, "devices": [CPU], "address": "127.0.0.1",
             "engines": ["llama.cpp"]}), time.time() - 1)


def reconcile(store: Store, tmp_path: Path) -> None:
    config = ControlConfig(state_dir=tmp_path, admin_token=ADMIN, join_token=JOIN,
                           router_token=ROUTER)
    Reconciler(store, config, holder="test").run_cycle()


def ready_all(store: Store) -> None:
    """Every replica placed so far reports ready (as its agent would)."""
    with store.begin() as conn:
        for i, rep in enumerate(repo.list_replicas(conn)):
            if rep.desired and rep.state != "ready":
                repo.update_replica(conn, rep.id, state="ready", port=41000 + i)


def apply(url: str, tmp_path: Path, text: str, *extra: str) -> tuple[int, str]:
    path = tmp_path / "catalog.yml"
    path.write_text(text)
    return ctl(url, "apply", "-f", str(path), *extra)


def test_a_changed_definition_rolls_and_every_view_says_so(
        control: str, store: Store, tmp_path: Path) -> None:  # noqa: F811
    put_node(store, "n1")
    assert apply(control, tmp_path, TINY % "")[0] == 0
    reconcile(store, tmp_path)
    ready_all(store)
    changed = TINY % ", args: [--ctx-size, '4096']"
    code, out = apply(control, tmp_path, changed, "--dry-run")
    assert code == 0 and "rolls: tiny (their replicas would be replaced" in out, out
    code, out = apply(control, tmp_path, changed)
    assert code == 0 and "model tiny updated" in out
    assert "rolls: tiny (their replicas are replaced by the new definition" in out
    code, out = ctl(control, "rollout", "status", "tiny")
    assert code == 0, out
    assert out.startswith("model tiny: rolling to definition ")
    assert "  old: 1/1 ready (definition " in out
    data = json.loads(ctl(control, "rollout", "status", "tiny", "-o", "json")[1])
    assert data["state"] == "rolling" and data["old_ready"] == 1
    replicas = ctl(control, "replicas")[1]
    assert "ready, old definition" in replicas
    models = ctl(control, "models")[1].splitlines()[1]
    assert "ready, rolling 0/1" in models
    status = ctl(control, "status")[1]
    assert "rollouts (1): llmgw ctl rollout status MODEL" in status
    code, out = ctl(control, "rollout", "promote", "tiny")
    assert code == 1 and "canary" in out
    code, out = ctl(control, "rollout", "undo", "tiny")
    assert code == 0 and "model tiny: rolling back to its previous definition" in out
    reconcile(store, tmp_path)
    code, out = ctl(control, "rollout", "status", "tiny", "--watch")
    assert code == 0 and out.splitlines()[-1].startswith("rollout of tiny done")


def test_cordon_uncordon_and_drain_as_an_operator_sees_them(
        control: str, store: Store, tmp_path: Path) -> None:  # noqa: F811
    put_node(store, "n1")
    put_node(store, "n2")
    assert apply(control, tmp_path, TINY % "")[0] == 0
    reconcile(store, tmp_path)
    ready_all(store)
    with store.begin() as conn:
        [on] = [r.node for r in repo.list_replicas(conn)]
    empty = "n2" if on == "n1" else "n1"
    code, out = ctl(control, "nodes", "cordon", empty)
    assert code == 0 and out.startswith(f"node {empty} cordoned: no new replica")
    listing = [line.split() for line in ctl(control, "nodes")[1].splitlines()]
    assert [empty, "1s", "ago", "-", "-", "-", "CORDONED:", "no", "new", "replicas", "here",
            "(uncordon", "takes", "it", "back)"] in listing
    assert "1 cordoned" in ctl(control, "status")[1].splitlines()[0]
    code, out = ctl(control, "nodes", "uncordon", empty)
    assert code == 0 and "uncordoned" in out
    assert "CORDONED" not in ctl(control, "nodes")[1]
    # the other node is cordoned too: nowhere for tiny's replica to go
    assert ctl(control, "nodes", "cordon", empty)[0] == 0
    code, out = ctl(control, "nodes", "drain", on)
    assert code == 1 and "tiny" in out and "--force" in out, out
    code, out = ctl(control, "nodes", "drain", on, "--force", "--timeout", "1s")
    assert code == 1, out
    waiting = "moved 0/1, waiting for a replacement of r-"
    assert out.splitlines()[0].startswith(f"node {on} cordoned and draining: {waiting}")
    assert "(tiny) to be placed" in out.splitlines()[0]
    assert f"timed out after 1s waiting for node {on} to drain: {waiting}" in out
    assert f"the drain goes on (`llmgw ctl nodes drain {on} --wait` follows it again)" in out
    code, out = ctl(control, "nodes", "drain", "nope")
    assert code == 1 and "nope" in out
    code, out = ctl(control, "nodes", "drain", empty, "--wait")
    assert code == 0 and out.startswith(f"node {empty} drained (no replica to move)"), out


def test_a_canary_is_shown_and_watching_a_failed_rollout_exits_non_zero(
        control: str, store: Store, tmp_path: Path) -> None:  # noqa: F811
    put_node(store, "n1")
    assert apply(control, tmp_path, TINY % "")[0] == 0
    reconcile(store, tmp_path)
    ready_all(store)
    code, out = apply(control, tmp_path, TINY % ", args: [-c, '4096'], "
                      "rollout: {canary_percent: 10}")
    assert code == 0 and "rolls: tiny" in out
    code, out = ctl(control, "rollout", "status", "tiny")
    assert code == 0 and " with 10 % of the requests" in out.splitlines()[0]
    assert "`llmgw ctl rollout promote tiny`" in out
    assert "canary 10 %" in ctl(control, "models")[1]
    with store.begin() as conn:
        state = json.loads(repo.get_model(conn, "tiny").rollout_state)
        repo.update_model(conn, "tiny", rollout_state=json.dumps(
            {**state, "state": "failed", "error": "llama_model_load: wrong magic number"}))
    code, out = ctl(control, "rollout", "status", "tiny", "--watch")
    assert code == 1
    assert out.splitlines()[0].startswith(
        "model tiny: rollout failed for 0s: llama_model_load: wrong magic number")
    assert "rollout of tiny failed: llama_model_load: wrong magic number; the old replicas " \
        "keep serving" in out
    assert "ready, rollout failed" in ctl(control, "models")[1]
