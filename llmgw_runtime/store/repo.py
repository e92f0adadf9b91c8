"""Reading and writing the store. Every function takes an open connection (a transaction)
and does plain SQL through SQLAlchemy Core: the decisions live elsewhere. The leases are
store/leases.py's (named here too, as every caller knows them)."""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..api.catalog import ModelSpec
from ..coop import sliced
from .db import fleet_changed, generation
from .leases import holds_lease as holds_lease
from .leases import lease_holder as lease_holder
from .leases import release_lease as release_lease
from .leases import try_lease as try_lease
from .models import SPEC_COLUMNS, spec_of, spec_to_row
from .noderows import CHUNK as CHUNK
from .noderows import chunks as chunks
from .noderows import devices_of as devices_of
from .noderows import homes as homes
from .noderows import inventory_of as inventory_of
from .noderows import record_heartbeats as record_heartbeats
from .noderows import record_report as record_report
from .noderows import replicas_using_node as replicas_using_node
from .schema import events, models, nodes, replica_parts, replicas

# ---------------------------------------------------------------- models


def model_to_dict(row: Any) -> dict[str, Any]:
    """A ``models`` row as the admin API shows it: its spec (store/models.py) and the
    fleet's state of it."""
    spec = spec_of(row)
    return {**spec.model_dump(mode="json", by_alias=True), "profile": spec.profile.to_dict(),
            "definition_hash": row.definition_hash, "parked": bool(row.parked),
            "consecutive_failures": row.consecutive_failures, "last_error": row.last_error,
            "last_failure_at": row.last_failure_at, "activated_at": row.activated_at,
            "placement_reason": row.placement_reason, "created": row.created,
            "updated": row.updated, "capacity_at": row.capacity_at,
            "capacity": json.loads(row.capacity) if row.capacity else None,
            "scale_target": row.scale_target,
            "rollout_state": _json_or_none(getattr(row, "rollout_state", None))}


def _json_or_none(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


# The fleet's state of a model that is created anew (a deleted name applied again).
FRESH: dict[str, Any] = {
    "parked": 0, "consecutive_failures": 0, "last_error": None, "last_failure_at": None,
    "activated_at": None, "placement_reason": None, "capacity_at": None, "capacity": None,
    "load": None, "scale_target": None, "scale_state": None, "previous_definition": None}


def apply_catalog(conn: Connection, specs: list[ModelSpec], now: float,
                  prune: bool = False, stored: list[Any] | None = None
                  ) -> dict[str, list[str]]:
    """Create or update each model; returns what changed. A model deleted while its
    replicas drain (``deleted_at``) is created again, and its replicas count again.
    ``prune`` deletes the others (``delete_model``: at once when nothing runs, else once
    their replicas drained). (What a new definition means, unparking and rolling, is the
    fleet layer's rule: control/fleet.apply_catalog.) ``stored``: every row of ``models``
    (deleted ones too) as this transaction read them (:func:`all_models`), else read here."""
    existing = {r.name: r for r in (all_models(conn) if stored is None else stored)}
    result: dict[str, list[str]] = {"created": [], "updated": [], "unchanged": [], "deleted": []}
    for spec in sliced(specs):  # a gevent worker's loop keeps serving (llmgw_runtime/coop.py)
        row = existing.get(spec.name)
        if row is not None and row.deleted_at is None and spec_of(row) == spec:
            result["unchanged"].append(spec.name)   # most entries: not even serialised
            continue
        values = spec_to_row(spec)
        if row is None:
            conn.execute(models.insert().values(
                name=spec.name, parked=0, consecutive_failures=0, created=now, updated=now,
                **values))
            result["created"].append(spec.name)
            continue
        if row.deleted_at is not None:     # created again: what was known of it goes
            conn.execute(models.update().where(models.c.name == spec.name).values(
                created=now, updated=now, deleted_at=None, **FRESH, **values))
            result["created"].append(spec.name)
            continue
        conn.execute(models.update().where(models.c.name == spec.name)
                     .values(updated=now, **values))
        result["updated"].append(spec.name)
    if prune:
        keep = {s.name for s in specs}
        for name in sorted(set(existing) - keep):
            if existing[name].deleted_at is None:
                delete_model(conn, name, now)
                result["deleted"].append(name)
    if result["created"] or result["updated"] or result["deleted"]:
        fleet_changed(conn, models=result["created"] + result["updated"] + result["deleted"])
    return result


def all_models(conn: Connection) -> list[Any]:
    """Every row of ``models``, deleted ones too, by name: one read for a catalog's apply,
    which asks the stored models three questions (control/admin_api.py); on a loaded web
    worker each read waits behind the worker's queue of heartbeats."""
    return list(conn.execute(sa.select(models).order_by(models.c.name)))


def listed(rows: list[Any]) -> list[Any]:
    """Of ``all_models``'s rows, those :func:`list_models` answers (not deleted)."""
    return [r for r in rows if r.deleted_at is None]


def list_models(conn: Connection, deleted: bool = False) -> list[Any]:
    """The catalog's models by name; ``deleted``: also those deleted whose replicas still
    drain (the reconciler's read)."""
    query = sa.select(models).order_by(models.c.name)
    if not deleted:
        query = query.where(models.c.deleted_at.is_(None))
    return list(conn.execute(query))


def models_named(conn: Connection, names: set[str]) -> dict[str, Any]:
    """Rows by name, deleted ones too (their draining replicas' assignments need them)."""
    if not names:
        return {}
    return {r.name: r for r in conn.execute(sa.select(models).where(models.c.name.in_(names)))}


def get_model(conn: Connection, name: str, deleted: bool = False) -> Any | None:
    """A model of the catalog (``deleted``: or one deleted whose replicas still drain)."""
    query = sa.select(models).where(models.c.name == name)
    if not deleted:
        query = query.where(models.c.deleted_at.is_(None))
    return conn.execute(query).first()


def delete_model(conn: Connection, name: str, now: float | None = None) -> bool:
    """Delete ``name`` from the catalog. With ``now``: while a wanted replica of it runs,
    the row stays, marked deleted (its replicas drain; the reconciler removes the row with
    the last of them); else the row goes at once, with its replicas (they are told to stop
    by disappearing from the assignments). Whether it was in the catalog."""
    if now is not None:
        wanted = conn.execute(sa.select(replicas.c.id).where(
            replicas.c.model == name, replicas.c.desired == 1).limit(1)).first()
        if wanted is not None:
            fleet_changed(conn, models=(name,))
            return conn.execute(models.update().where(
                models.c.name == name, models.c.deleted_at.is_(None))
                .values(deleted_at=now, updated=now)).rowcount > 0
        if get_model(conn, name) is None:
            return False
    ids = sa.select(replicas.c.id).where(replicas.c.model == name)
    gone = [r[0] for r in conn.execute(ids)]
    fleet_changed(conn, models=(name,), replicas=gone, nodes=homes(conn, gone))
    conn.execute(replica_parts.delete().where(replica_parts.c.replica_id.in_(ids)))
    conn.execute(replicas.delete().where(replicas.c.model == name))
    return conn.execute(models.delete().where(models.c.name == name)).rowcount > 0


def merge_rollout_state(conn: Connection, name: str, keys: dict[str, Any],
                        cut: int = 0) -> dict[str, Any] | None:
    """Set ``keys`` of the model's ``rollout_state`` (None drops one) and add ``cut`` to its
    count of requests cut by drain timeouts, on the row as it is now (locked), so what a
    router posts meanwhile is kept. Returns the new state (None: no such row)."""
    row = conn.execute(sa.select(models.c.rollout_state).where(models.c.name == name)
                       .with_for_update()).first()
    if row is None:
        return None
    state = _json_or_none(row.rollout_state)
    state = {**(state if isinstance(state, dict) else {}), **keys}
    if cut:
        state["cut"] = int(state.get("cut") or 0) + cut
    kept = {k: v for k, v in state.items() if v is not None}
    conn.execute(models.update().where(models.c.name == name).values(
        rollout_state=json.dumps(kept, sort_keys=True) if kept else None))
    return kept


_SPEC = frozenset(SPEC_COLUMNS)


def update_model(conn: Connection, name: str, **values: Any) -> None:
    """Write a model's columns. A catalog field (what an assignment carries, replicas,
    drain_timeout_s, ...) is logged, so the reconciler's incremental view re-reads the model
    (it reads only the fleet's own columns each pass: control/incremental.py); the fleet's
    own columns (load, parking, rollout state) are not."""
    if _SPEC.intersection(values):
        fleet_changed(conn, models=(name,))
    conn.execute(models.update().where(models.c.name == name).values(**values))


# ---------------------------------------------------------------- nodes


def node_to_dict(row: Any) -> dict[str, Any]:
    return {"name": row.name, "fabric": row.fabric, "address": row.address,
            "last_report": row.last_report, "agent_version": row.agent_version,
            "devices": json.loads(row.devices), "engines": json.loads(row.engines),
            "weights": json.loads(row.weights), "hardware": json.loads(row.hardware),
            "problem": row.problem or row.plan_problem,
            "cordoned": bool(getattr(row, "cordoned", 0))}


def set_node_drain(conn: Connection, name: str, cordoned: bool,
                   drain: dict[str, Any] | None) -> bool:
    """A node's cordon and drain (JSON, control/drain.py); whether the node exists."""
    fleet_changed(conn, nodes=(name,))
    return conn.execute(nodes.update().where(nodes.c.name == name).values(
        cordoned=int(cordoned),
        drain=json.dumps(drain, sort_keys=True) if drain is not None else None)).rowcount > 0


def list_nodes(conn: Connection) -> list[Any]:
    return list(conn.execute(sa.select(nodes).order_by(nodes.c.name)))


def get_node(conn: Connection, name: str) -> Any | None:
    return conn.execute(sa.select(nodes).where(nodes.c.name == name)).first()


def set_node_credential(conn: Connection, name: str, credential_hash: str, now: float) -> None:
    """A node's new credential; a replaced one stops working in every process (caches of
    the report path are keyed by credential: the fleet generation moves). Logged for a
    new node too: the reconciler's fleet in memory learns of a node that joined from the
    change log (control/incremental.py), not from a read of every node."""
    row = get_node(conn, name)
    fleet_changed(conn, nodes=(name,))
    if row is None:
        conn.execute(nodes.insert().values(name=name, credential_hash=credential_hash,
                                           devices="[]", engines="[]", weights="{}",
                                           created=now))
    else:
        conn.execute(nodes.update().where(nodes.c.name == name)
                     .values(credential_hash=credential_hash))


def set_plan_problem(conn: Connection, name: str, problem: str | None) -> None:
    """Why the planner leaves the node out (None: it does not); kept apart from the
    problem its reports set, so neither overwrites the other."""
    conn.execute(nodes.update().where(nodes.c.name == name).values(plan_problem=problem))


def node_by_credential(conn: Connection, credential_hash: str) -> Any | None:
    """The node a credential belongs to: its name, address, problem, last report, devices
    and inventory digest, and the fleet generation (store/db.py) as of this read."""
    return conn.execute(_BY_CREDENTIAL, {"hash": credential_hash}).first()


_BY_CREDENTIAL = sa.select(nodes.c.name, nodes.c.address, nodes.c.problem, nodes.c.inventory,
                           nodes.c.last_report, nodes.c.devices,
                           generation().label("generation")) \
    .where(nodes.c.credential_hash == sa.bindparam("hash"))


def fleet_generation(conn: Connection) -> int | None:
    """The fleet generation (None before revision 0007)."""
    value = conn.execute(sa.select(generation())).scalar()
    return int(value) if value is not None else None


def model_sources(conn: Connection) -> list[str]:
    """Every model's source, sorted and without repeats."""
    return sorted({r[0] for r in conn.execute(sa.select(models.c.source))})


# ---------------------------------------------------------------- replicas


def replica_to_dict(row: Any, parts: list[Any] | None = None) -> dict[str, Any]:
    """A replica's row as plain values (control/fleet.py ``replica_view`` adds what is
    derived from it: its drain and whether it runs the current definition)."""
    out = {"id": row.id, "model": row.model, "node": row.node,
           "devices": json.loads(row.devices), "port": row.port, "pid": row.pid,
           "state": row.state, "desired": bool(row.desired), "started": row.started,
           "updated": row.updated, "last_used": row.last_used, "last_error": row.last_error,
           "rendezvous_port": row.rendezvous_port,
           "progress": json.loads(row.progress) if row.progress else None}
    out["parts"] = [part_to_dict(p) for p in parts or []]
    return out


def part_to_dict(row: Any) -> dict[str, Any]:
    return {"rank": row.rank, "node": row.node, "devices": json.loads(row.devices),
            "state": row.state, "pid": row.pid, "last_error": row.last_error}


def list_replicas(conn: Connection, node: str | None = None) -> list[Any]:
    """Replicas by model and start (``node``: those it heads). Each row of the whole list
    carries ``model_hash``, its model's current definition (None: no model row)."""
    if node is not None:
        return list(conn.execute(sa.select(replicas).where(replicas.c.node == node)
                                 .order_by(replicas.c.model, replicas.c.started)))
    query = (sa.select(replicas, models.c.definition_hash.label("model_hash"))
             .select_from(replicas.outerjoin(models, models.c.name == replicas.c.model))
             .order_by(replicas.c.model, replicas.c.started))
    return list(conn.execute(query))


def draining_replicas(conn: Connection, lock: bool = False) -> list[Any]:
    """Wanted replicas that drain (``lock``: kept locked to the end of the transaction,
    so two router posts do not write over each other's in-flight counts)."""
    query = sa.select(replicas).where(replicas.c.desired == 1,
                                      replicas.c.drain_since.is_not(None)) \
        .order_by(replicas.c.id)
    if lock:
        query = query.with_for_update()
    return list(conn.execute(query))


def get_replica(conn: Connection, replica_id: str) -> Any | None:
    return conn.execute(sa.select(replicas).where(replicas.c.id == replica_id)).first()


def add_replica(conn: Connection, replica_id: str, model: str, node: str,
                devices: tuple[int, ...], now: float,
                parts: tuple[tuple[int, str, tuple[int, ...]], ...] = (),
                rendezvous_port: int | None = None, definition_hash: str | None = None,
                launch: str | None = None) -> None:
    """A new pending replica; ``parts`` are its worker parts as (rank, node, devices);
    ``definition_hash`` and ``launch`` (JSON) the model definition it runs."""
    add_replicas(conn, [NewReplica(replica_id, model, node, devices, parts, rendezvous_port,
                                   definition_hash, launch)], now)


class NewReplica(NamedTuple):
    """A replica :func:`add_replicas` writes (``add_replica``'s arguments)."""

    replica_id: str
    model: str
    node: str
    devices: tuple[int, ...]
    parts: tuple[tuple[int, str, tuple[int, ...]], ...] = ()
    rendezvous_port: int | None = None
    definition_hash: str | None = None     # the model definition it runs
    launch: str | None = None              # its launch fields (JSON, rollout.launch_fields)


def add_replicas(conn: Connection, new: list[NewReplica], now: float) -> None:
    """New pending replicas, with their worker parts, in one statement for the replicas and
    one for the parts (a pass's starts: each statement a round trip on a loaded host)."""
    if not new:
        return
    fleet_changed(conn, replicas=[r.replica_id for r in new],
                  nodes={n for r in new for n in (r.node, *(p[1] for p in r.parts))})
    conn.execute(replicas.insert(), [
        {"id": r.replica_id, "model": r.model, "node": r.node,
         "devices": json.dumps(list(r.devices)), "state": "pending", "desired": 1,
         "started": now, "updated": now, "rendezvous_port": r.rendezvous_port,
         "definition_hash": r.definition_hash, "launch": r.launch} for r in new])
    parts = [{"replica_id": r.replica_id, "rank": rank, "node": part_node,
              "devices": json.dumps(list(part_devices)), "state": "pending", "updated": now}
             for r in new for rank, part_node, part_devices in r.parts]
    if parts:
        conn.execute(replica_parts.insert(), parts)


def parts_by_replica(conn: Connection) -> dict[str, list[Any]]:
    """Every worker part, grouped by replica id, in rank order."""
    out: dict[str, list[Any]] = {}
    for row in conn.execute(sa.select(replica_parts).order_by(replica_parts.c.replica_id,
                                                              replica_parts.c.rank)):
        out.setdefault(row.replica_id, []).append(row)
    return out


def parts_of(conn: Connection, replica_ids: list[str]) -> dict[str, list[Any]]:
    if not replica_ids:
        return {}
    out: dict[str, list[Any]] = {}
    rows = conn.execute(sa.select(replica_parts)
                        .where(replica_parts.c.replica_id.in_(replica_ids))
                        .order_by(replica_parts.c.replica_id, replica_parts.c.rank))
    for row in rows:
        out.setdefault(row.replica_id, []).append(row)
    return out


def parts_on_node(conn: Connection, node: str) -> list[Any]:
    return list(conn.execute(sa.select(replica_parts).where(replica_parts.c.node == node)
                             .order_by(replica_parts.c.replica_id, replica_parts.c.rank)))


def update_part(conn: Connection, replica_id: str, rank: int, **values: Any) -> None:
    fleet_changed(conn, replicas=(replica_id,), nodes=homes(conn, [replica_id]))
    conn.execute(replica_parts.update().where(replica_parts.c.replica_id == replica_id)
                 .where(replica_parts.c.rank == rank).values(**values))


def used_rendezvous_ports(conn: Connection, nodes_: set[str]) -> set[int]:
    """Rendezvous ports of replicas with a part (head or worker) on any of ``nodes_``."""
    if not nodes_:
        return set()
    heads = sa.select(replicas.c.rendezvous_port).where(replicas.c.node.in_(nodes_))
    workers = (sa.select(replicas.c.rendezvous_port)
               .join(replica_parts, replica_parts.c.replica_id == replicas.c.id)
               .where(replica_parts.c.node.in_(nodes_)))
    ports = {r[0] for r in conn.execute(heads)} | {r[0] for r in conn.execute(workers)}
    return {p for p in ports if p is not None}


def update_replica(conn: Connection, replica_id: str, **values: Any) -> None:
    """Change a replica's row. Anything but its last use and its requests in flight
    changes what the report path caches (agent_api.py), so the transaction moves the
    assignments generation."""
    update_replicas(conn, [replica_id], **values)


def update_replicas(conn: Connection, replica_ids: list[str], **values: Any) -> None:
    """:func:`update_replica` of each of ``replica_ids`` with the same values, a statement
    per :data:`CHUNK` of them."""
    if not replica_ids:
        return
    if set(values) - {"last_used", "in_flight"}:
        fleet_changed(conn, replicas=replica_ids, nodes=homes(conn, replica_ids))
    for chunk in chunks(replica_ids):
        conn.execute(replicas.update().where(replicas.c.id.in_(chunk)).values(**values))


def delete_replica(conn: Connection, replica_id: str) -> None:
    delete_replicas(conn, [replica_id])


def delete_replicas(conn: Connection, replica_ids: list[str]) -> None:
    """The replicas and their worker parts, two statements per :data:`CHUNK` of them."""
    if not replica_ids:
        return
    fleet_changed(conn, replicas=replica_ids, nodes=homes(conn, replica_ids))
    for chunk in chunks(replica_ids):
        conn.execute(replica_parts.delete().where(replica_parts.c.replica_id.in_(chunk)))
        conn.execute(replicas.delete().where(replicas.c.id.in_(chunk)))


# ---------------------------------------------------------------- events


def add_event(conn: Connection, now: float, kind: str, subject: str, message: str) -> None:
    add_events(conn, now, [(kind, subject, message)])


def add_events(conn: Connection, now: float, new: list[tuple[str, str, str]]) -> None:
    """Events (kind, subject, message) at ``now``, in one statement, ids in list order."""
    if new:
        conn.execute(events.insert(), [{"time": now, "kind": kind, "subject": subject,
                                        "message": message} for kind, subject, message in new])


def list_events(conn: Connection, limit: int = 100) -> list[dict[str, Any]]:
    rows = conn.execute(sa.select(events).order_by(events.c.id.desc()).limit(limit))
    return [{"id": r.id, "time": r.time, "kind": r.kind, "subject": r.subject,
             "message": r.message} for r in rows]


# ---------------------------------------------------------------- revocation


def reset_node_credential(conn: Connection, name: str) -> bool:
    """Forget the node's credential (NULL), so its host can join again with the join token
    and nothing holding the old credential can report; whether the node exists."""
    fleet_changed(conn, nodes=(name,))
    return conn.execute(nodes.update().where(nodes.c.name == name)
                        .values(credential_hash=None)).rowcount > 0


def delete_node(conn: Connection, name: str) -> list[Any] | None:
    """Delete the node ``name`` and every replica that uses it (a multi-node replica whole:
    it cannot run without the part; its other parts stop when it leaves their assignments).
    Returns the replicas deleted, or None when there is no such node."""
    if get_node(conn, name) is None:
        return None
    fleet_changed(conn, nodes=(name,))
    gone = replicas_using_node(conn, name)
    for rep in gone:
        delete_replica(conn, rep.id)
    conn.execute(nodes.delete().where(nodes.c.name == name))
    return gone


def mark_unreachable(conn: Connection, replica_id: str, now: float, error: str) -> Any | None:
    """Set a wanted ``ready`` replica ``unreachable`` (a router could not connect to it),
    in one conditional update so that a report written meanwhile is never overwritten.
    Returns the replica's row as it was, or None when it was not a wanted ready replica."""
    row = get_replica(conn, replica_id)
    if row is None:
        return None
    fleet_changed(conn, replicas=(replica_id,), nodes=homes(conn, [replica_id]))
    done = conn.execute(
        replicas.update()
        .where(replicas.c.id == replica_id, replicas.c.state == "ready",
               replicas.c.desired == 1)
        .values(state="unreachable", updated=now, last_error=error))
    return row if done.rowcount == 1 else None
