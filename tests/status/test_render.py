"""``llmgw ctl status`` as text: fits the width, colour only when asked, the same screen
shape for 4 nodes and for 2,000."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from llmgw_runtime.status import summary
from llmgw_runtime.status.render import render
from tests.status.builders import NOW, big_fleet, small_fleet

SNAPSHOTS = Path(__file__).parent / "snapshots"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STORE = {"backend": "postgresql", "members": [
    {"name": "pg1", "role": "leader", "state": "running", "lag_bytes": 0, "missing": False},
    {"name": "pg2", "role": "sync_standby", "state": "streaming", "lag_bytes": 2048,
     "missing": False},
    {"name": "pg3", "role": None, "state": None, "lag_bytes": None, "missing": True,
     "problem": "its REST API does not answer"}]}


def small() -> dict:
    return summary.build(*small_fleet(), NOW, 30.0, idle_after_s=900, store=STORE)


def big() -> dict:
    return summary.build(*big_fleet(), NOW, 30.0, idle_after_s=900)


@pytest.mark.parametrize("width", [80, 160])
def test_small_fleet_matches_its_snapshot(width: int) -> None:
    """Review a change to the screen in the snapshot's diff; regenerate with
    LLMGW_UPDATE_SNAPSHOTS=1."""
    text = render(small(), width)
    path = SNAPSHOTS / f"small-{width}.txt"
    if os.environ.get("LLMGW_UPDATE_SNAPSHOTS"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


@pytest.mark.parametrize("width", [60, 80, 120, 200])
@pytest.mark.parametrize("fleet", ["small", "big"])
def test_no_line_is_wider_than_the_terminal(fleet: str, width: int) -> None:
    text = render(small() if fleet == "small" else big(), width)
    too_wide = [line for line in text.splitlines() if len(line) > width]
    assert not too_wide, too_wide


def test_two_thousand_nodes_read_as_aggregates_with_what_needs_the_operator() -> None:
    text = render(big(), 120)
    lines = text.splitlines()
    assert len(lines) < 120                       # a screen or two, not 16,000 rows
    assert "nodes 1,980/2,000 reporting (20 silent)" in text
    assert re.search(r"h100-80g\s+14,400\s+", text)       # totals with thousands marks
    # only the models that need someone are listed, capped, with where to see the rest
    assert "ready or idle; the others:" in text
    assert "model-0005" in text and "model-0007" in text and "model-0001 " not in text
    assert re.search(r"\.\.\. and \d+ more \(llmgw ctl models\)", text)
    assert "parked (11):" in text and "unplaceable (12):" in text
    # idle replicas, longest first; unknown kept apart with "-"
    idle_block = text.split("idle: ", 1)[1]
    assert "last use unknown" in idle_block


def test_unknown_last_use_is_a_dash_never_a_number() -> None:
    text = render(small(), 120)
    unknown = text.split("last use unknown", 1)[1].splitlines()
    row = next(line for line in unknown if "r-qwen-2" in line)
    assert row.split()[2] == "-"


def test_colour_only_when_asked() -> None:
    plain, coloured = render(small(), 120), render(small(), 120, color=True)
    assert not ANSI.search(plain)
    assert "\x1b[31mparked" in coloured and "\x1b[31mMISSING" in coloured
    # colour never moves a column: without the codes it is the same screen
    assert ANSI.sub("", coloured) == plain


def test_a_store_without_a_leader_says_so() -> None:
    members = [dict(m, role="replica") for m in STORE["members"]]
    s = summary.build(*small_fleet(), NOW, store={"backend": "postgresql",
                                                  "members": members})
    assert "store: postgresql, 3 members, NO LEADER" in render(s, 100)


def test_an_empty_fleet_says_what_to_do() -> None:
    text = render(summary.build([], [], [], NOW), 80)
    assert "capacity: no devices reported" in text
    assert "llmgw ctl apply -f catalog.yml" in text


EVIL = "\x1b[2J"          # clears the operator's screen if printed raw


def test_names_and_messages_with_escape_sequences_are_shown_escaped() -> None:
    from tests.status.builders import mig, model, node, replica

    models, nodes, replicas = small_fleet()
    models.append(model(f"m{EVIL}", state="parked", ready=0, failures=5,
                        last_error=f"first\nboom{EVIL}\x07\x9b31m"))
    nodes.append(node(f"n{EVIL}\u202e", mig(0, 1), fabric=f"ib{EVIL}", hardware={"cards": [
        {"index": 1, "klass": "a100-80g", "problem": f"no MIG{EVIL}",
         "hint": f"carve\r\n{EVIL}"}]}))
    replicas.append(replica(f"r{EVIL}", f"m{EVIL}", f"n{EVIL}\u202e", [1001],
                            last_used_ago=7200))
    data = summary.build(models, nodes, replicas, NOW, 30.0, idle_after_s=900)
    for color in (False, True):
        text = render(data, 200, color)
        plain = ANSI.sub("", text)            # only our own colour codes may be raw
        assert "\x1b" not in plain and "\x07" not in text and "\x9b" not in text
        assert "\r" not in text and "\u202e" not in text
        assert "m\\x1b[2J" in plain and "n\\x1b[2J\\u202e card 1: no MIG\\x1b[2J" in plain
        assert "ib\\x1b[2J" in plain and "r\\x1b[2J" in plain
        assert "boom\\x1b[2J\\x07\\x9b31m" in plain    # the last line of the error
        assert "carve\\x0d" in plain
    assert all(len(line) <= 200 for line in render(data, 200).splitlines())


def test_a_shared_cpu_shows_memory_used_and_free_and_idle_counts_it_once() -> None:
    """Two demo replicas on one CPU (as `llmgw up` with a second model): the capacity row
    is not "FREE 0, 100%" while more replicas still fit, and the idle line says one device."""
    from tests.status.builders import cpu, model, node, replica

    models = [model("smol", klass="cpu", memory_gb=1), model("tiny", klass="cpu")]
    reps = [replica("a", "smol", "cpu-01", [0], last_used_ago=3600),
            replica("b", "tiny", "cpu-01", [0], last_used_ago=7200)]
    text = render(summary.build(models, [node("cpu-01", cpu(32, 8))], reps, NOW,
                                idle_after_s=900), 120)
    [row] = [line for line in text.splitlines() if line.startswith("  cpu*")]
    cols = row.split()
    assert cols[:4] == ["cpu*", "1", "8.0", "GB"] and cols[4:6] == ["24.0", "GB"], row
    assert "25%" in cols and "100%" not in row
    assert "* cpu: 2 replicas share 1 device; USED and FREE are memory (docs/operations.md, " \
           "Sharing a device)" in text
    assert "idle: 2 replicas holding 1 device, unused for 15m" in text
