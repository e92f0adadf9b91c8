"""Every catalog the documentation shows is accepted: read by the catalog's validation and
applied with ``llmgw ctl apply -f`` to a real control service (SQLite, on 127.0.0.1).

What counts as a catalog: a fenced ```yaml (or ```yml) block in README.md or docs/*.md whose
document is a mapping with a top-level ``models`` list, a list of mappings each with a
``name`` and one of the model fields ``source``, ``engine``, ``profile`` (a model entry list,
applied as ``models:`` of it), or one such mapping (one entry). Other YAML (Prometheus,
Ansible) is left alone. A block that cannot be read as YAML at all fails.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.cli.main import cli
from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.store import Store
from tests.control.conftest import ADMIN, JOIN, ROUTER, served

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```",
                   re.S | re.M)


def yaml_blocks(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each ```yaml block of a Markdown file, dedented."""
    text = path.read_text()
    for match in FENCE.finditer(text):
        if match.group("lang").lower() not in ("yaml", "yml"):
            continue
        indent = len(match.group("indent"))
        body = "\n".join(line[indent:] for line in match.group("body").splitlines())
        yield text.count("\n", 0, match.start()) + 1, body


def as_catalog(document: Any) -> dict[str, Any] | None:
    """The catalog a block shows, by the rule in the module's docstring; None if none."""
    if isinstance(document, dict) and isinstance(document.get("models"), list):
        return document
    if is_entry(document):
        return {"models": [document]}
    if isinstance(document, list) and document and all(is_entry(e) for e in document):
        return {"models": document}
    return None


def is_entry(value: Any) -> bool:
    """A model entry as a doc would show one: a name and a model field."""
    return isinstance(value, dict) and "name" in value and bool(
        {"source", "engine", "profile"} & value.keys())


def doc_catalogs() -> list[Any]:
    found = []
    for path in DOCS:
        for line, body in yaml_blocks(path):
            document = yaml.safe_load(body)
            shown = as_catalog(document)
            if shown is not None:       # applied as written when it is a whole catalog
                name = f"{path.relative_to(ROOT)}:{line}"
                text = body if shown is document else yaml.safe_dump(shown)
                found.append(pytest.param(name, text, id=name))
    return found


CATALOGS = doc_catalogs()


def test_the_rule_finds_the_catalogs_the_docs_are_known_to_show() -> None:
    names = [p.values[0] for p in CATALOGS]
    assert any(n.startswith("README.md:") for n in names), names
    assert any(n.startswith("docs/operations.md:") for n in names), names


def test_an_entry_shown_alone_or_without_an_engine_is_still_a_catalog() -> None:
    # A doc showing entries that lack a required field must be checked (and fail), not
    # skipped as "not a catalog"; Ansible tasks and Prometheus rules are not entries.
    assert as_catalog([{"name": "m", "source": "file:///m.gguf"}]) is not None
    assert as_catalog({"name": "m", "engine": "llama.cpp"}) is not None
    assert as_catalog([{"name": "Install | x", "ansible.builtin.copy": {"src": "a"}}]) is None
    assert as_catalog({"groups": [{"name": "llmgw", "rules": []}]}) is None


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real control service on SQLite, served on 127.0.0.1 (stopped afterwards)."""
    tmp = tmp_path_factory.mktemp("control")
    store = Store(f"sqlite:///{tmp}/llmgw.db")
    store.migrate()
    config = ControlConfig(state_dir=tmp, admin_token=ADMIN, join_token=JOIN,
                           router_token=ROUTER)
    bootstrap(store, config)
    try:
        with served(create_app(config, store_=store)) as url:
            yield url
    finally:
        store.dispose()


def ctl(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["ctl", "--url", url, "--token", ADMIN, *args], env={})
    return result.exit_code, result.output


@pytest.mark.parametrize("where, text", CATALOGS)
def test_a_catalog_in_the_docs_is_valid_and_applies(where: str, text: str, control: str,
                                                    tmp_path: Path) -> None:
    specs = catalog.parse(text)         # CatalogError, naming every problem, if refused
    path = tmp_path / "catalog.yaml"
    path.write_text(text)
    code, out = ctl(control, "apply", "-f", str(path))
    assert code == 0, f"{where}: ctl apply refused the documented catalog:\n{out}"
    code, out = ctl(control, "models", "-o", "json")
    assert code == 0, out
    for spec in specs:
        assert f'"{spec.name}"' in out, f"{where}: {spec.name} is not in ctl models"


def test_a_cpu_model_with_a_flag_the_cpu_engine_lacks_is_refused_by_ctl_apply(
        control: str, tmp_path: Path) -> None:
    """docs/operations.md, "The CPU engine": refused at apply, not after five starts."""
    path = tmp_path / "catalog.yaml"
    path.write_text("models:\n  - name: embedder\n    source: file:///srv/models/e.gguf\n"
                    "    engine: llama.cpp\n    profile: {class: cpu}\n"
                    "    args: [\"--embeddings\", \"--flash-attn\", \"on\"]\n")
    code, out = ctl(control, "apply", "-f", str(path))
    flat = " ".join(out.split())
    assert code != 0
    assert "models[0] (embedder): args --flash-attn are not flags of the CPU engine" in flat
    assert "--ctx-size/-c" in flat and "--embeddings/--embedding" in flat
    assert "nothing was applied" in flat
    code, out = ctl(control, "models", "-o", "json")
    assert '"embedder"' not in out
