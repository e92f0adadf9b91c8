"""The capacity index finds the same node a scan of every node would find."""

from __future__ import annotations

import pytest

from llmgw_runtime.api.catalog import ModelSpec
from llmgw_runtime.placement import Plan, place
from llmgw_runtime.placement.capacity import Capacity, Choice, Request
from llmgw_runtime.placement.model import Snapshot

from .builders import as_running, small_fleet


def _scan(cap: Capacity, req: Request) -> Choice | None:
    """The reference: rank every reporting node by the documented order."""
    on_node, in_fabric = dict(req.on_node), dict(req.in_fabric)
    best: tuple[tuple[int, ...], Choice] | None = None
    for node in cap.reporting():
        if req.klass not in node.by_class or req.engine not in node.engines:
            continue
        fit = cap._fit(node, req)
        if fit is None:
            continue
        choice = cap._choice(node, fit, req, on_node, in_fabric)
        key = cap._key(choice, node.rank, req.spread)
        if best is None or key < best[0]:
            best = (key, choice)
    return best[1] if best else None


def _requests(fleet: Snapshot) -> list[tuple[Request, ModelSpec]]:
    out = []
    for model in sorted(fleet.models, key=lambda m: m.spec.name):
        spec = model.spec
        if spec.profile.nodes > 1:
            continue
        for n in range(model.wanted):
            out.append((Request(klass=spec.profile.klass, engine=spec.engine,
                                gpus=spec.profile.gpus, nodes=1,
                                memory_gb=spec.profile.memory_gb, source=spec.source,
                                spread=spec.strategy == "spread",
                                on_node=(("n01", 1), ("n05", n)),
                                in_fabric=(("ib-a", n),)), spec))
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("half_running", [False, True])
def test_the_index_picks_what_a_full_scan_picks(seed: int, half_running: bool) -> None:
    fleet = small_fleet(seed=seed)
    if half_running:
        running = as_running(fleet, _plan(fleet))
        fleet = Snapshot(models=fleet.models, nodes=fleet.nodes,
                         replicas=running.replicas[::2], now=fleet.now)
    specs = {m.spec.name: m.spec for m in fleet.models}
    indexed, reference = Capacity(fleet, specs), Capacity(fleet, specs)
    placed = 0
    for req, spec in _requests(fleet) * 3:
        got, want = indexed.best_single(req), _scan(reference, req)
        assert got == want
        if got is not None:
            indexed.take(got, spec)
            reference.take(got, spec)
            placed += 1
    assert placed > 10


def _plan(fleet: Snapshot) -> Plan:
    return place(fleet)
