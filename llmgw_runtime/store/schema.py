"""Tables of the store (DESIGN.md "Data"). Times are Unix seconds (float); JSON is text;
booleans are integer columns written as 0/1 on both backends."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

from .models import spec_columns

metadata = MetaData()

# A model: its catalog entry, one column per field of api/catalog.py's ModelSpec (derived
# there: store/models.py ``spec_columns``; revisions 0001, 0003, 0008, 0010-0012, 0014, 0015 added
# them), and the fleet's state of it.
models = Table(
    "models", metadata,
    Column("name", String(200), primary_key=True),
    *spec_columns(),
    Column("definition_hash", String(64), nullable=False),
    Column("parked", Integer, nullable=False, default=0),
    Column("consecutive_failures", Integer, nullable=False, default=0),
    Column("last_error", Text, nullable=True),
    Column("last_failure_at", Float, nullable=True),
    Column("activated_at", Float, nullable=True),
    Column("placement_reason", Text, nullable=True),   # why it cannot be placed, or NULL
    Column("created", Float, nullable=False),
    Column("updated", Float, nullable=False),
    # revision 0008: the last report of a router that found it at capacity
    Column("capacity_at", Float, nullable=True),     # store clock of the newest report
    Column("capacity", Text, nullable=True),         # JSON: store/capacity.py
    # revision 0012: what the routers reported of its load (JSON: control/capacity.py); the
    # reconciler's target and its state (JSON: control/autoscale.py).
    Column("load", Text, nullable=True),
    Column("scale_target", Integer, nullable=True),
    Column("scale_state", Text, nullable=True),
    # revision 0015 (rollouts, docs/operations.md): the rollout's state (JSON:
    # control/rollout.py), the definition before the current one (JSON of its ModelSpec:
    # what `ctl rollout undo` applies again), and when it was deleted from the catalog
    # (its replicas drain first; the row goes with the last of them).
    Column("rollout_state", Text, nullable=True),
    Column("previous_definition", Text, nullable=True),
    Column("deleted_at", Float, nullable=True),
)

nodes = Table(
    "nodes", metadata,
    Column("name", String(200), primary_key=True),
    Column("fabric", String(200), nullable=True),
    Column("address", String(255), nullable=True),
    Column("last_report", Float, nullable=True),
    Column("agent_version", String(40), nullable=True),
    Column("devices", Text, nullable=False, default="[]"),   # JSON
    Column("engines", Text, nullable=False, default="[]"),   # JSON
    Column("weights", Text, nullable=False, default="{}"),   # JSON
    Column("credential_hash", String(64), nullable=True),
    Column("created", Float, nullable=False),
    # JSON: {"source", "driver_version", "cards": [...], "problems": [...]} (revision 0002)
    Column("hardware", Text, nullable=False, default="{}", server_default="{}"),
    Index("ix_nodes_credential_hash", "credential_hash", unique=True),   # revision 0004
    Column("problem", Text, nullable=True),    # why its report was not used in full (0006)
    # a digest of engines, weights and hardware as last written (0007)
    Column("inventory", String(64), nullable=True),
    # why the planner leaves it out (0007; ``problem`` is what its reports set)
    Column("plan_problem", Text, nullable=True),
    # revision 0015: no new replica is placed on a cordoned node; a drain (JSON {since,
    # force, by, total}) moves its replicas elsewhere (control/drain.py)
    Column("cordoned", Integer, nullable=False, default=0, server_default="0"),
    Column("drain", Text, nullable=True),
)

replicas = Table(
    "replicas", metadata,
    Column("id", String(64), primary_key=True),
    Column("model", String(200), ForeignKey("models.name", ondelete="CASCADE"), nullable=False),
    Column("node", String(200), nullable=False),
    Column("devices", Text, nullable=False, default="[]"),   # JSON list of placement ids
    Column("port", Integer, nullable=True),
    Column("pid", Integer, nullable=True),
    Column("state", String(20), nullable=False),             # pending/starting/ready/failed/stopping
    Column("desired", Integer, nullable=False, default=1),   # 0: the control service wants it gone
    Column("started", Float, nullable=False),
    Column("updated", Float, nullable=False),
    Column("last_used", Float, nullable=True),
    Column("last_error", Text, nullable=True),
    # revision 0003: the port every part of a multi-node replica meets on; download progress
    Column("rendezvous_port", Integer, nullable=True),
    Column("progress", Text, nullable=True),     # JSON {"bytes", "total", "rate_bps"}
    # revision 0015: the model definition it runs (its hash, and the launch fields an
    # assignment carries, JSON), and its drain: since when, why, how long it may take,
    # and what each router worker last said it has in flight there (JSON {worker:
    # [count, store time]}).
    Column("definition_hash", String(64), nullable=True),
    Column("launch", Text, nullable=True),
    Column("drain_since", Float, nullable=True),
    Column("drain_reason", Text, nullable=True),
    Column("drain_timeout_s", Float, nullable=True),
    Column("in_flight", Text, nullable=True),
    Index("ix_replicas_model", "model"),
    Index("ix_replicas_node", "node"),
)

# The worker parts (rank >= 1) of a multi-node replica; the head (rank 0) is the replica row.
replica_parts = Table(
    "replica_parts", metadata,
    Column("replica_id", String(64), ForeignKey("replicas.id", ondelete="CASCADE"),
           primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("node", String(200), nullable=False),
    Column("devices", Text, nullable=False, default="[]"),   # JSON list of placement ids
    Column("state", String(20), nullable=False),
    Column("pid", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("updated", Float, nullable=False),
    Index("ix_replica_parts_node", "node"),
)

events = Table(
    "events", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("time", Float, nullable=False),
    Column("kind", String(40), nullable=False),
    Column("subject", String(255), nullable=False),
    Column("message", Text, nullable=False),
    Index("ix_events_time", "time"),
)

accounts = Table(
    "accounts", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("kind", String(20), nullable=False),              # admin/api_key/join/router
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("is_admin", Integer, nullable=False, default=0),
    Column("created", Float, nullable=False),
    # revision 0008: an API key's priority in a model's queue (high/normal/low)
    Column("priority", String(10), nullable=False, default="normal",
           server_default="normal"),
    # revision 0009: the models an API key may use (JSON list; NULL: all) and when it
    # stops working (store clock; NULL: never)
    Column("models", Text, nullable=True),
    Column("expires_at", Float, nullable=True),
    # revision 0013: an API key's limits, requests and tokens per minute (NULL: none)
    Column("rpm", Integer, nullable=True),
    Column("tpm", BigInteger, nullable=True),
)

# Usage (revision 0013, store/usage.py): tokens per API key and model, as routers report
# them, summed per hour of the store's clock (``bucket``: the hour's start, Unix seconds).
# ``key`` is the key's name when the report arrived ("-": no key; "(deleted)").
usage = Table(
    "usage", metadata,
    Column("bucket", Float, primary_key=True),
    Column("key", String(200), primary_key=True),
    Column("model", String(200), primary_key=True),
    Column("requests", BigInteger, nullable=False, default=0),
    Column("prompt_tokens", BigInteger, nullable=False, default=0),
    Column("completion_tokens", BigInteger, nullable=False, default=0),
    Column("refused", BigInteger, nullable=False, default=0, server_default="0"),  # 0018
)

# The same since the store began, never pruned: the control service's /metrics counters.
usage_totals = Table(
    "usage_totals", metadata,
    Column("key", String(200), primary_key=True),
    Column("model", String(200), primary_key=True),
    Column("requests", BigInteger, nullable=False, default=0),
    Column("prompt_tokens", BigInteger, nullable=False, default=0),
    Column("completion_tokens", BigInteger, nullable=False, default=0),
    Column("refused", BigInteger, nullable=False, default=0, server_default="0"),  # 0018
)

# The last usage report applied per reporter (a router worker process): a report whose
# ``seq`` is not above it is a retry, not applied again.
usage_reporters = Table(
    "usage_reporters", metadata,
    Column("reporter", String(100), primary_key=True),
    Column("seq", BigInteger, nullable=False),
    Column("updated", Float, nullable=False),
    Index("ix_usage_reporters_updated", "updated"),
)

# Routers heard from (revision 0016, store/routers.py): by the id a router posts its idle
# map under (new at each start), whether it serves requests without an API key, and when
# that was last heard (store clock; written again only when it changed or is ~10 s old).
routers = Table(
    "routers", metadata,
    Column("id", String(100), primary_key=True),
    Column("keys_optional", Integer, nullable=False),       # 0 or 1, as every flag
    Column("heard", Float, nullable=False),
    Index("ix_routers_heard", "heard"),
)

# The fleet's history (revision 0017, store/history.py): what the reconciler saw per
# model and per device class each minute (step 60, kept two days) and the hours those roll
# up into (step 3600, kept history_days); ``t`` is the period's start (store clock).
# ``first_byte``: JSON counts of the routers' first-byte times per
# api.router.FIRST_BYTE_BUCKETS_S bucket (the last: above them); NULL: none answered.
history_models = Table(
    "history_models", metadata,
    Column("model", String(200), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("t", Float, primary_key=True),
    Column("ready", Integer, nullable=False, default=0),
    Column("wanted", Integer, nullable=False, default=0),
    Column("waiting", Integer, nullable=False, default=0),
    Column("busy", Integer, nullable=False, default=0),
    Column("slots", Integer, nullable=False, default=0),
    Column("refused", BigInteger, nullable=False, default=0),
    Column("requests", BigInteger, nullable=False, default=0),
    Column("first_byte", Text, nullable=True),
    Index("ix_history_models_t", "step", "t"),
)
history_classes = Table(
    "history_classes", metadata,
    Column("device_class", String(100), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("t", Float, primary_key=True),
    Column("devices", Integer, nullable=False, default=0),     # devices of live nodes
    Column("used", Integer, nullable=False, default=0),        # held by replicas
    Column("replicas", Integer, nullable=False, default=0),    # ready replicas on them
    Index("ix_history_classes_t", "step", "t"),
)

# Device-time (revision 0017, store/devicetime.py): the device-seconds each model's
# replicas held (starting, ready or draining) per hour (``bucket``: its start, store
# clock) and device class; GPU-hours per key share a model's hour by the key's tokens.
device_time = Table(
    "device_time", metadata,
    Column("bucket", Float, primary_key=True),
    Column("model", String(200), primary_key=True),
    Column("device_class", String(100), primary_key=True),
    Column("seconds", Float, nullable=False, default=0),
)

leases = Table(
    "leases", metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(200), nullable=False),
    Column("expires", Float, nullable=False),                # database clock, Unix seconds
)

# Counters moved when a transaction that changed what they count commits (revision 0007):
# "fleet" moves whenever what a node should run, or what is stored of a node beyond its
# last report, may have changed (store/db.py, control/reports.py).
generations = Table(
    "generations", metadata,
    Column("name", String(64), primary_key=True),
    Column("value", BigInteger, nullable=False),
)

# The fleet's change log (revision 0019, store/changes.py): what each committed write that
# moved the "fleet" generation changed, one row per thing (``kind``: node, telemetry (a
# node's device readings only), model, replica, or all), ``seq`` the generation it moved
# to, ``at`` the store's clock. Pruned by the reconciler's leader; ``generations`` row
# "changes_floor" is the newest generation whose entries may be gone.
changes = Table(
    "changes", metadata,
    Column("seq", BigInteger, nullable=False),
    Column("kind", String(20), nullable=False),
    Column("key", String(255), nullable=False),
    Column("at", Float, nullable=False),
    Index("ix_changes_seq", "seq"),
)

# Web console logins (revision 0005). The cookie carries a random session id; only its
# SHA-256 is stored, so a copy of the store lets nobody in. ``csrf`` is the token every
# console form must send back.
console_sessions = Table(
    "console_sessions", metadata,
    Column("id_hash", String(64), primary_key=True),
    Column("account", String(200), nullable=False),
    Column("csrf", String(64), nullable=False),
    Column("created", Float, nullable=False),
    Column("expires", Float, nullable=False),
    Index("ix_console_sessions_expires", "expires"),
)
