"""What a catalog apply changes in a model's entry, field by field, as ``ctl apply`` shows
it (``old -> new``): the answer's ``changes`` (api.admin.ModelChange). Pure: two entries in,
the changed fields out; values as the catalog writes them, long ones shortened."""

from __future__ import annotations

import json
from typing import Any

from ..api.admin import FieldChange
from ..api.catalog import ModelSpec
from ..api.fields import clean

MAX_SHOWN = 60     # characters of a value shown; the whole entry is in `ctl models -o json`


def shown(value: Any) -> str:
    """A value as the catalog writes it, on one line and at most MAX_SHOWN characters:
    ``8192``, ``file:///m.gguf``, ``["--ctx-size", "8192"]``, ``none`` for unset."""
    if value is None:
        text = "none"
    elif isinstance(value, str):
        text = " ".join(clean(value).split()) if value.strip() else json.dumps(value)
    else:
        text = json.dumps(value, separators=(", ", ": "))
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN - 1] + "…"


def _pairs(prefix: str, old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """The (field, old, new) that differ; a mapping on both sides (profile, rollout,
    max_tokens, autoscale) by its keys (``profile.class``)."""
    if old == new:
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return [pair for key in [*old, *(k for k in new if k not in old)]
                for pair in _pairs(f"{prefix}.{key}", old.get(key), new.get(key))]
    return [(prefix, old, new)]


def field_changes(old: ModelSpec, new: ModelSpec) -> list[FieldChange]:
    """The fields of ``new`` that differ from ``old``, in the entry's order."""
    before = old.model_dump(mode="json", by_alias=True)
    after = new.model_dump(mode="json", by_alias=True)
    return [FieldChange(field=field, old=shown(a), new=shown(b))
            for name in after for field, a, b in _pairs(name, before.get(name), after[name])]
