"""``ctl apply --dry-run`` shows what changes in each model (``field: old -> new``) and
which running replicas its new definition replaces; the apply says it compactly; a bad
catalog is refused naming every problem at once (issue 28). Against a real control
service, its reconciler run in the test."""

from __future__ import annotations

import json
from pathlib import Path

from llmgw_runtime.api.admin import CatalogResult
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.control.catalog_diff import field_changes
from llmgw_runtime.store import Store
from tests.cli.test_commands import catalog_file, control, ctl  # noqa: F401 - the fixture
from tests.cli.test_ctl_rollout import TINY, apply, put_node, ready_all, reconcile

LONG = "file:///models/" + "a-very-long-directory-name/" * 4 + "tiny.gguf"


def test_dry_run_shows_each_changed_field_and_the_replicas_replaced(
        control: str, store: Store, tmp_path: Path) -> None:  # noqa: F811
    put_node(store, "n1")
    assert apply(control, tmp_path, TINY % ", replicas: 2")[0] == 0
    reconcile(store, tmp_path)
    ready_all(store)
    running = sorted(r["id"] for r in json.loads(ctl(control, "replicas", "-o", "json")[1])
                     ["replicas"])
    assert len(running) == 2
    changed = (TINY % ", replicas: 2, aliases: [chat], args: [--ctx-size, '4096']").replace(
        "file:///models/tiny.gguf", LONG)
    code, out = apply(control, tmp_path, changed, "--dry-run")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "model tiny would be updated"
    assert '  aliases: [] -> ["chat"]' in lines
    assert '  args: [] -> ["--ctx-size", "4096"]' in lines
    [source] = [ln for ln in lines if ln.startswith("  source: ")]
    assert source.startswith("  source: file:///models/tiny.gguf -> file:///models/a-very")
    assert source.endswith("…") and len(source.split(" -> ")[1]) == 60      # shortened
    assert not [ln for ln in lines if ln.startswith("  replicas:")]        # unchanged
    assert f"  replaces 2 running replicas: {', '.join(running)}" in lines
    assert "each drained first: no request is dropped" in lines[-2]
    assert lines[-1] == "dry run: nothing was changed"
    # the apply says the same compactly
    code, out = apply(control, tmp_path, changed)
    assert code == 0, out
    assert out.splitlines()[0] == ("model tiny updated: aliases, source, args; replacing "
                                   + ", ".join(running))
    # a change outside the definition replaces nothing
    code, out = apply(control, tmp_path, changed.replace("replicas: 2", "replicas: 3"),
                      "--dry-run")
    assert code == 0 and out.splitlines()[:2] == ["model tiny would be updated",
                                                  "  replicas: 2 -> 3"], out
    assert "replaces" not in out


def test_an_older_answer_without_changes_still_parses() -> None:
    old = CatalogResult.model_validate({"created": [], "updated": ["a"], "unchanged": [],
                                        "deleted": [], "rolls": ["a"]})
    assert old.changes == {}


def test_field_changes_name_a_mappings_key_and_say_none_for_unset() -> None:
    old, = catalog.parse(TINY % "")
    new, = catalog.parse(TINY.replace("{class: cpu}", "{class: cpu, memory_gb: 8}")
                         % ", slots: 4, max_tokens: {max: 512}")
    changes = [(c.field, c.old, c.new) for c in field_changes(old, new)]
    assert changes == [("max_tokens", "none", '{"default": null, "max": 512, "clamp": false}'),
                       ("profile.memory_gb", "none", "8.0"), ("slots", "none", "4")]
    assert field_changes(new, new) == []


def test_apply_names_every_problem_and_fallbacks_may_name_what_the_store_keeps(
        control: str, tmp_path: Path) -> None:  # noqa: F811
    assert apply(control, tmp_path, TINY.replace("tiny", "kept") % "")[0] == 0
    entry = ("  - {name: %s, source: /m.gguf, engine: llama.cpp, profile: {class: cpu}, "
             "args: [%s]%s}\n")
    text = "models:\n" + entry % ("a", "--port, '1'", ", fallback: [nope, fb-only, kept]") \
        + entry % ("fb-only", "--host, x", "")
    code, out = ctl(control, "apply", "-f", catalog_file(tmp_path, text))
    assert code == 1 and "the catalog has 3 problems; nothing was applied" in out, out
    assert "models[0] (a): args --port set what the agent owns" in out
    assert "models[1] (fb-only): args --host set what the agent owns" in out
    assert "model a: fallback nope is not a model of the catalog" in out
    assert "fallback fb-only" not in out and "fallback kept" not in out
