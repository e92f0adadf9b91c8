"""What a node's reports write of its row, and where replicas live (the nodes a change
log entry of a replica names). Re-exported by store/repo.py, where callers find them."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from pydantic import TypeAdapter
from sqlalchemy.engine import Connection

from ..api.agent import DeviceReport, Report
from .db import fleet_changed
from .schema import nodes, replica_parts, replicas

CHUNK = 400     # keys per IN (...) list: SQLite's older builds take 999 bound parameters


def chunks(keys: Collection[str]) -> list[list[str]]:
    """``keys`` (in their order) in lists of at most :data:`CHUNK`, one IN list each."""
    ordered = list(keys)
    return [ordered[i:i + CHUNK] for i in range(0, len(ordered), CHUNK)]


def homes(conn: Connection, replica_ids: Collection[str]) -> set[str]:
    """The nodes the replicas ``replica_ids`` live on: their heads' and parts' (for the
    change log: a replica's write names its nodes)."""
    if not replica_ids:
        return set()
    out = set[str]()
    for chunk in chunks(replica_ids):   # two IN lists of CHUNK: within SQLite's 999
        heads = sa.select(replicas.c.node).where(replicas.c.id.in_(chunk))
        parts = sa.select(replica_parts.c.node).where(replica_parts.c.replica_id.in_(chunk))
        out.update(r[0] for r in conn.execute(sa.union(heads, parts)))
    return out


def replicas_using_node(conn: Connection, name: str) -> list[Any]:
    """Replicas headed on ``name`` or with a worker part on it, by model and start."""
    with_part = sa.select(replica_parts.c.replica_id).where(replica_parts.c.node == name)
    return list(conn.execute(
        sa.select(replicas)
        .where(sa.or_(replicas.c.node == name, replicas.c.id.in_(with_part)))
        .order_by(replicas.c.model, replicas.c.started)))


def _json(value: Any) -> Any:
    """A message (or a list of them) as JSON values, every field given."""
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value.model_dump(mode="json", by_alias=True)


_DEVICES: TypeAdapter[list[DeviceReport]] = TypeAdapter(list[DeviceReport])


def devices_of(report: Report) -> str:
    """The report's devices as the ``devices`` column holds them (JSON, every field given;
    serialised by pydantic: this runs for every report and heartbeat with devices)."""
    return _DEVICES.dump_json(report.devices, by_alias=True).decode()


def inventory_of(report: Report) -> tuple[dict[str, str], str]:
    """The slow-changing columns of a report as stored, and their digest."""
    slow = {"fabric": report.fabric or "",
            "agent_version": report.agent_version or "",
            "engines": json.dumps(report.engines),
            "weights": json.dumps(_json(report.weights)),
            "hardware": json.dumps({"source": report.device_source,
                                    "driver_version": report.driver_version,
                                    "cards": _json(report.cards),
                                    "problems": report.device_problems})}
    digest = hashlib.sha256("\0".join(slow.values()).encode()).hexdigest()
    return slow, digest


def record_report(conn: Connection, name: str, report: Report, now: float,
                  problem: str | None = None, alive: bool = True,
                  before: Any | None = None) -> str:
    """Store a parsed report; ``problem`` says what of it was not used (its address is
    then not stored). An agent's last report (``alive``
    false) leaves the node not heard from, so it is not capacity from now on.

    ``before`` is the node as stored (``node_by_credential``): engines, weights and
    hardware are written only when they changed (devices always are: they carry the memory
    in use). The change log names the node when anything but its devices changed (a first
    report, a new address, problem or inventory, a stopping agent), a new address the
    nodes that share a replica with it too (it is in their assignments); else its device
    readings (kind telemetry) when they differ from ``before``'s. Returns the inventory
    digest."""
    slow, digest = inventory_of(report)
    values: dict[str, Any] = {
        "address": report.address if problem is None else None, "problem": problem,
        "last_report": now if alive else None, "devices": devices_of(report)}
    if before is None or digest != before.inventory:
        values.update(slow, inventory=digest, fabric=report.fabric,
                      agent_version=report.agent_version)
    if before is not None and before.inventory is not None \
            and before.address != values["address"]:
        peers = replicas_using_node(conn, name)
        ids = [r.id for r in peers]
        fleet_changed(conn, nodes={name} | homes(conn, ids), replicas=ids)
    elif before is None or digest != before.inventory or before.problem != problem \
            or before.address != values["address"] or not alive \
            or before.last_report is None:
        fleet_changed(conn, nodes=(name,))
    elif getattr(before, "devices", None) != values["devices"]:
        fleet_changed(conn, telemetry=(name,))
    conn.execute(nodes.update().where(nodes.c.name == name).values(**values))
    return digest


_HEARTBEAT = nodes.update().where(
    nodes.c.name == sa.bindparam("node"), nodes.c.last_report.is_not(None),
    nodes.c.last_report < sa.bindparam("at")).values(
    last_report=sa.bindparam("at"),
    devices=sa.func.coalesce(sa.bindparam("devices", type_=sa.Text), nodes.c.devices))
# PostgreSQL: one statement of fixed text (compiled once) for any number of rows.
_HEARTBEATS_AT_ONCE = sa.text(
    "UPDATE nodes SET last_report = beat.at, devices = COALESCE(beat.devices, nodes.devices) "
    "FROM unnest(CAST(:names AS text[]), CAST(:ats AS double precision[]), "
    "CAST(:devices AS text[])) AS beat(node, at, devices) "
    "WHERE nodes.name = beat.node AND nodes.last_report IS NOT NULL "
    "AND nodes.last_report < beat.at RETURNING nodes.name")


def record_heartbeats(conn: Connection, rows: list[tuple[str, float, str | None]],
                      telemetry: Collection[str] = ()) -> list[str]:
    """Refresh nodes' last report time and devices (node, time, devices JSON, or None to
    keep the stored devices: the writer knows them unchanged): never backwards, and never
    for a node whose agent said it stopped (NULL last report).
    ``telemetry``: the nodes whose devices differ from what was written last, named in
    the change log (kind telemetry) when refreshed. Returns the nodes not refreshed (their
    stored state moved on meanwhile). On PostgreSQL all rows are one statement of three
    arrays (a statement a row, or a VALUES list SQLAlchemy renders, cost a sixth of a
    control worker's CPU at 1,000 reports a second); SQLite, one machine's store, takes
    them one by one."""
    if conn.dialect.name == "postgresql":
        ordered = sorted(rows)           # rows locked in one order by every writer
        done = set(conn.execute(_HEARTBEATS_AT_ONCE, {
            "names": [n for n, _, _ in ordered], "ats": [at for _, at, _ in ordered],
            "devices": [d for _, _, d in ordered]}).scalars())
        stale = [n for n, _, _ in rows if n not in done]
    else:
        stale = [n for n, at, d in rows
                 if conn.execute(_HEARTBEAT, {"node": n, "at": at, "devices": d}).rowcount != 1]
    changed = set(telemetry) - set(stale)
    if changed:
        fleet_changed(conn, telemetry=changed)
    return stale
