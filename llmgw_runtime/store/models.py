"""A catalog entry as a ``models`` row and back, derived from its definition.

Every field of api/catalog.py's ``ModelSpec`` but ``name`` is a column of the same name (a
migration adds the column of a new field): a nested value (``profile``, ``autoscale``,
``max_tokens``) or a list (``args``, ``aliases``, ``fallback``) is JSON text, a flag is 0 or
1, the rest is stored as it is. NULL reads as the field's default. ``definition_hash`` is
stored beside the fields (what changes unpark a model, and what the agents' launches carry).
Pure: no connection here.
"""

from __future__ import annotations

import json
import typing
from operator import attrgetter
from typing import Any

from sqlalchemy import BigInteger, Column, Float, Integer, String, Text

from ..api.catalog import MODEL_FIELDS, Frozen, ModelSpec, bounds

# The columns of a row that are a spec's fields (the rest is the fleet's state of it).
SPEC_COLUMNS = tuple(n for n in MODEL_FIELDS if n != "name")


def _kind(name: str) -> Any:
    """The field's type without its ``| None``."""
    annotation = ModelSpec.model_fields[name].annotation
    inner = [k for k in typing.get_args(annotation) if k is not type(None)]
    return inner[0] if type(None) in typing.get_args(annotation) else annotation


def _is_json(name: str) -> bool:
    kind = _kind(name)
    return typing.get_origin(kind) is tuple or (isinstance(kind, type)
                                                and issubclass(kind, Frozen))


_JSON = frozenset(n for n in SPEC_COLUMNS if _is_json(n))
_FLAGS = frozenset(n for n in SPEC_COLUMNS if _kind(n) is bool)


def spec_columns() -> list[Column[Any]]:
    """The ``models`` table's columns of the spec's fields (store/schema.py), derived from
    their definitions: JSON text, 0/1 integers for flags, big integers past 2**31, floats,
    strings of their maximum length. NOT NULL where the field has a default other than
    None (a JSON list or value: its JSON). The migrations create the same columns."""
    out = []
    for name in SPEC_COLUMNS:
        info = ModelSpec.model_fields[name]
        kind = _kind(name)
        limit = bounds(name).get("max_length") or bounds(name).get("le")
        column_type: Any
        if name in _JSON:
            column_type = Text
        elif name in _FLAGS:
            column_type = Integer
        elif kind is int:
            column_type = BigInteger if (limit or 0) >= 2**31 else Integer
        elif kind is float:
            column_type = Float
        else:
            column_type = String(limit) if limit else Text
        fallback = None if info.is_required() else info.get_default(call_default_factory=True)
        if name in _JSON and fallback is not None:
            fallback = json.dumps(list(fallback) if isinstance(fallback, tuple) else fallback)
        elif name in _FLAGS and fallback is not None:
            fallback = int(fallback)
        out.append(Column(name, column_type, nullable=fallback is None and not
                          info.is_required(), default=fallback))
    return out


def spec_to_row(spec: ModelSpec) -> dict[str, Any]:
    """The column values of ``spec`` (without ``name``), its definition hash included."""
    out: dict[str, Any] = {"definition_hash": spec.definition_hash}
    for name in SPEC_COLUMNS:
        value = getattr(spec, name)
        if name in _JSON:
            if isinstance(value, Frozen):
                value = json.dumps(value.to_dict(), sort_keys=True)
            elif value is not None:
                value = json.dumps(list(value))
        elif name in _FLAGS:
            value = int(value)
        out[name] = value
    return out


def row_to_spec(row: Any) -> ModelSpec:
    """The spec a ``models`` row holds (NULL: the field's default)."""
    values: dict[str, Any] = {"name": row.name}
    for name in SPEC_COLUMNS:
        value = getattr(row, name)
        if value is None:
            continue
        if name in _JSON:
            value = json.loads(value)
            value = tuple(value) if isinstance(value, list) else value
        elif name in _FLAGS:
            value = bool(value)
        values[name] = value
    return ModelSpec.model_validate(values, strict=False)


_SPECS: dict[tuple[Any, ...], ModelSpec] = {}
_SPEC_KEY = attrgetter("name", *SPEC_COLUMNS)
_SPECS_MAX = 16384


def spec_of(row: Any) -> ModelSpec:
    """``row_to_spec(row)``, remembered by the row's name and spec columns: a reconcile
    pass asks for every model's spec several times each second, and a catalog apply
    compares every stored entry with the applied one (1,000 validations inside its
    transaction); catalogs rarely change (a changed column is another key; the specs are
    frozen, so sharing one is safe)."""
    key = _SPEC_KEY(row)
    spec = _SPECS.get(key)
    if spec is None:
        if len(_SPECS) >= _SPECS_MAX:
            _SPECS.clear()
        spec = _SPECS[key] = row_to_spec(row)
    return spec
