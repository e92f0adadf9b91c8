"""A catalog's apply reads the stored models once in its transaction (control/admin_api.py,
``repo.all_models``): on a web worker answering thousands of heartbeats a second each read
waits behind them, and a 1,000-model apply under 10,000 agents took 2-14 s (one was
answered 503 past the store's wait bound) while it read them four times."""

from __future__ import annotations

import re

from .conftest import Api, statements

ENTRY = "  - {{name: m{i}, source: /m{i}.gguf, engine: llama.cpp, profile: {{class: cpu}}{more}}}\n"


def catalog(models: int, changed: int | None = None) -> str:
    return "models:\n" + "".join(ENTRY.format(i=i, more=", replicas: 2" if i == changed else "")
                                 for i in range(models))


def model_reads(sent: list[str]) -> int:
    """Reads of the whole models table (not of one model by name, nor joined)."""
    return sum(1 for s in sent if re.search(r"^\s*SELECT\b.*\bFROM models\b", s, re.S | re.I)
               and "JOIN" not in s.upper() and "models.name =" not in s)


def test_an_apply_reads_the_stored_models_once_in_its_transaction(api: Api) -> None:
    assert len(api.call("PUT", "/api/v1/catalog", data=catalog(20)).json["created"]) == 20
    with statements(api.store) as sent:
        answer = api.call("PUT", "/api/v1/catalog", data=catalog(20, changed=3)).json
    assert answer["updated"] == ["m3"] and len(answer["unchanged"]) == 19
    # one read to check the catalog against what stays, one in the apply's transaction
    assert model_reads(sent) == 2, [s for s in sent if "FROM models" in s]
    with statements(api.store) as sent:
        pruned = api.call("PUT", "/api/v1/catalog?prune=true", data=catalog(19)).json
    assert pruned["deleted"] == ["m19"] and model_reads(sent) == 1


def replica_reads(sent: list[str]) -> int:
    return sum(1 for s in sent if re.search(r"^\s*SELECT\b.*\bFROM replicas\b", s, re.S | re.I))


def test_an_apply_reads_the_replicas_only_when_a_definition_changed(api: Api) -> None:
    """A new replica count or a new model starts no rollout: the replicas, thousands at
    10,000 nodes, are not read; a changed definition reads them for the rollout."""
    api.call("PUT", "/api/v1/catalog", data=catalog(5))
    with statements(api.store) as sent:
        answer = api.call("PUT", "/api/v1/catalog", data=catalog(6, changed=2)).json
    assert answer["updated"] == ["m2"] and answer["created"] == ["m5"]
    assert answer["rolls"] == [] and replica_reads(sent) == 0
    changed = catalog(6, changed=2).replace("/m4.gguf", "/m4-v2.gguf")
    with statements(api.store) as sent:
        answer = api.call("PUT", "/api/v1/catalog", data=changed).json
    assert answer["updated"] == ["m4"] and replica_reads(sent) == 1
