"""docs/catalog.md's field table is the catalog entry's (api/catalog.py), not a hand copy
that drifts: every field a catalog may write (``catalog_names()``) has a row with its
default as the doc writes it, no row names a field the entry lacks, and the row of a nested
entry (profile, autoscale, max_tokens) names each of its settings with its default. The
catalogs the doc shows match the entry's generated schema (the OpenAPI's
``CatalogEntry``)."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from llmgw_runtime.api.catalog import ModelSpec, catalog_names, default, extra
from llmgw_runtime.api.openapi import control_document
from tests.test_doc_catalogs import as_catalog, yaml_blocks

DOC = Path(__file__).resolve().parents[1] / "docs" / "catalog.md"
ROW = re.compile(r"^\| (?P<names>`[^|]+`) \| (?P<default>[^|]+) \| (?P<what>.+) \|$", re.M)


def catalog_fields(cls: type[BaseModel] = ModelSpec) -> dict[str, str]:
    """The catalog's name of each field of ``cls`` -> the field (``idle_stop_after`` ->
    ``idle_stop_after_s``, ``class`` -> ``klass``; ``replicas_max`` has no name: the
    catalog writes it inside ``replicas``)."""
    fields = [n for n in cls.model_fields
              if not ("catalog" in extra(cls, n) and extra(cls, n)["catalog"] is None)]
    return dict(zip(catalog_names(cls), fields, strict=True))


def nested(name: str, cls: type[BaseModel] = ModelSpec) -> type[BaseModel] | None:
    annotation = cls.model_fields[name].annotation
    for kind in (annotation, *typing.get_args(annotation)):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            return kind
    return None


def written(cls: type[BaseModel], name: str) -> str:
    """A field's default as docs/catalog.md writes it: ``required``, ``none`` (no value, or
    an empty list), ``true``/``false``, a choice in backticks, a number as ``1,000``."""
    if cls.model_fields[name].is_required():
        return "required"
    value = default(name, cls)
    if value is None or value == ():
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"`{value}`"
    return f"{value:,g}"


def table() -> dict[str, tuple[str, str]]:
    """The rows of the "## Fields" table: each field a row names -> (default, what)."""
    text = DOC.read_text()
    start = text.index("\n## Fields\n")
    end = text.find("\n## ", start + 1)
    rows: dict[str, tuple[str, str]] = {}
    for row in ROW.finditer(text[start:end if end > 0 else None]):
        for name in re.findall(r"`([^`]+)`", row["names"]):
            assert name not in rows, f"{name} has two rows"
            rows[name] = (row["default"].strip(), row["what"])
    return rows


def starts_with(cell: str, value: str) -> bool:
    """``cell`` says ``value`` first (``none: from the args ...``; ``30`` is not ``300``)."""
    return re.match(rf"{re.escape(value)}(?![\w.])", cell) is not None


def test_every_catalog_field_has_a_row_and_every_row_is_a_field() -> None:
    rows = table()

    assert [n for n in catalog_names() if n not in rows] == [], "fields without a row"
    assert [n for n in rows if n not in catalog_names()] == [], "rows of no field"


@pytest.mark.parametrize("field", catalog_names())
def test_each_row_gives_the_fields_default(field: str) -> None:
    said, _ = table().get(field, ("(no row)", ""))
    name = catalog_fields()[field]

    assert starts_with(said, written(ModelSpec, name)), (field, said)


@pytest.mark.parametrize("field", [k for k, n in catalog_fields().items() if nested(n)])
def test_a_nested_entrys_row_names_each_setting_with_its_default(field: str) -> None:
    """``profile``: `` `gpus` (1, per node)``, ``autoscale``: `` `up_after_s` (30)``..."""
    cls = nested(catalog_fields()[field])
    assert cls is not None
    _, what = table().get(field, ("(no row)", ""))
    missing = []
    for key, name in catalog_fields(cls).items():
        if cls.model_fields[name].is_required():
            shown = f"`{key}`" in what
        else:
            shown = re.search(rf"`{re.escape(key)}` \({re.escape(written(cls, name))}"
                              r"(?![\w.])", what) is not None
        if not shown:
            missing.append(f"{key} ({written(cls, name)})")

    assert missing == [], f"{field}'s row does not name these settings so"


def catalogs() -> list[Any]:
    out = []
    for line, body in yaml_blocks(DOC):
        found = as_catalog(yaml.safe_load(body))
        if found is not None:
            out.append(pytest.param(found, id=f"line-{line}"))
    return out


@pytest.mark.parametrize("catalog", catalogs())
def test_each_catalog_the_doc_shows_matches_the_published_schema(catalog: Any) -> None:
    components = control_document("test")["components"]
    schema = {"$ref": "#/components/schemas/Catalog", "components": components}

    jsonschema.Draft202012Validator(schema).validate(catalog)


def test_the_published_entry_names_every_catalog_field() -> None:
    entry = control_document("test")["components"]["schemas"]["CatalogEntry"]

    assert list(entry["properties"]) == list(catalog_names())
    for key, name in catalog_fields().items():
        cls = nested(name)
        if cls is not None:
            schema = control_document("test")["components"]["schemas"][
                f"CatalogEntry_{cls.__name__}"]
            assert list(schema["properties"]) == list(catalog_names(cls)), key
