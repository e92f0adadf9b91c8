"""Every Molecule scenario's test_sequence names only steps it has: a playbook step
(prepare, converge, verify, side_effect, cleanup) needs its playbook in the scenario
directory or named under provisioner.playbooks (issue 28: the store scenario listed a
`prepare` it did not have). Reads the files only; Molecule is not run."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK_STEPS = ("prepare", "converge", "verify", "side_effect", "cleanup")
OTHER_STEPS = ("dependency", "lint", "destroy", "syntax", "create", "idempotence")


def scenarios() -> list[Path]:
    return sorted([*ROOT.glob("molecule/*/molecule.yml"),
                   *ROOT.glob("roles/*/molecule/*/molecule.yml")])


def missing_steps(scenario: Path) -> list[str]:
    config = yaml.safe_load(scenario.read_text()) or {}
    sequence = (config.get("scenario") or {}).get("test_sequence") or []
    named = (config.get("provisioner") or {}).get("playbooks") or {}
    problems = []
    for step in sequence:
        if step in PLAYBOOK_STEPS:
            playbook = scenario.parent / str(named.get(step, f"{step}.yml"))
            if not playbook.is_file():
                problems.append(f"{step}: no {playbook.relative_to(ROOT)}")
        elif step not in OTHER_STEPS:
            problems.append(f"{step}: not a Molecule step")
    return problems


def test_every_scenario_has_the_steps_its_test_sequence_lists() -> None:
    found = scenarios()
    assert ROOT / "molecule" / "store" / "molecule.yml" in found
    problems = {str(s.relative_to(ROOT)): missing_steps(s) for s in found}
    assert {s: p for s, p in problems.items() if p} == {}
