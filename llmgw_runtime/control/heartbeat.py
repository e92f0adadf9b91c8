"""Answering a node: its full report, or its heartbeat (issue 30), from this process's
caches when nothing needs writing, else in one transaction (control/reports.py).

A heartbeat names the digest of the last full report its agent sent and carries only what
changed since: its replicas' states and its devices' readings. The control process that
holds that report (``ReportCache.reports``) puts them in place of the report's and answers
as it would answer that report: from its caches when that repeats what is stored, else
through the same transaction as a report (a replica that became ready is written without
the agent sending its full report). A process that does not hold the report (another
control host, a restart) answers ``full_report``: the agent sends it at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask import current_app, g, request

from ..api.agent import (
    Heartbeat,
    HeartbeatAnswer,
    Report,
    ReportAnswer,
    report_digest,
    twice,
)
from ..api.parse import parse_json
from ..errors import ForbiddenError, ValidationError
from ..store import repo
from . import identity
from .assignments import assignments_for, devices_key, part_id
from .beats import Heartbeats
from .reports import (
    Answer,
    Held,
    NodeEntry,
    ReportCache,
    apply_heads,
    apply_parts,
    report_answer,
    unchanged,
)
from .resolve import Resolver
from .web import authenticate, now_of, store


def caches() -> tuple[ReportCache, Heartbeats]:
    ext = current_app.extensions
    return ext["llmgw.reports"], ext["llmgw.heartbeats"]


def held_of(report: Report, digest: str) -> Held:
    """A report as held for the heartbeats that will name ``digest``."""
    return Held(digest, report, repo.inventory_of(report)[1], repo.devices_of(report))


def answer_report(raw: bytes) -> ReportAnswer:
    """A node's full report: from this process's caches when it repeats what is stored,
    else in one transaction whose first statement checks the credential."""
    cache, heartbeats = caches()
    generation = cache.current(store())
    entry = cache.nodes.get(g.token_hash) if generation is not None else None
    if entry is None:
        return in_transaction(None, raw)
    held = held_of(parse_json(Report, raw, what="report"), report_digest(raw))
    answer = steady(cache, heartbeats, entry, held, request.remote_addr)
    if answer is None:
        return in_transaction(held, raw)
    cache.hold(entry.name, held)
    return answer


def answer_heartbeat(raw: bytes) -> HeartbeatAnswer:
    """A node's heartbeat: answered as its last full report with the heartbeat's replicas
    and devices would be, or ``full_report`` when this process does not hold that report."""
    cache, heartbeats = caches()
    beat = parse_json(Heartbeat, raw, what="heartbeat")
    _unique(beat)
    generation = cache.current(store())
    entry = cache.nodes.get(g.token_hash) if generation is not None else None
    held = cache.reports.get(beat.node)
    if held is None or held.digest != beat.digest:
        if entry is None:                      # a credential not seen here (or forgotten)
            store().transaction(authenticate, idempotent=True)
        _same_node(entry.name if entry is not None else g.principal, beat.node)
        return HeartbeatAnswer(full_report=True)
    if entry is not None:
        _same_node(entry.name, beat.node)
    held = _merged(held, beat)
    if entry is not None:
        answered = _from_memory(cache, heartbeats, entry, held, request.remote_addr)
        if answered is not None:
            return answered
    return HeartbeatAnswer(answer=in_transaction(held, None))


@dataclass(frozen=True)
class Answered:
    """A steady heartbeat's answer as sent, with what it was answered from. The same bytes
    from the same address get the same answer while each of these is still what the caches
    hold: a change replaces the cached object (a new entry, report, answer or sources), so
    each is compared by identity."""

    raw: bytes
    peer: str | None
    entry: NodeEntry
    held: Held
    hit: Answer
    sources: tuple[list[str], str]
    interval_s: float
    body: bytes


def steady_heartbeat(token_hash: str, raw: bytes, peer: str | None) -> bytes | None:
    """A heartbeat answered from this process's memory alone (in an app context, without a
    request's), as the bytes of what :func:`answer_heartbeat` answers for a steady node
    whose credential, report and answer this process holds; None for anything else (a
    malformed heartbeat, a credential or report not held here, a change to write): the
    Flask view then answers it, errors included (``SteadyHeartbeats``). What it answers is
    remembered (``Answered``) for :func:`repeated`."""
    cache, heartbeats = caches()
    if cache.current(store()) is None:
        return None
    entry = cache.nodes.get(token_hash)
    if entry is None:
        return None
    config = current_app.config["LLMGW"]
    try:
        beat = parse_json(Heartbeat, raw, what="heartbeat")
        _unique(beat)
    except ValidationError:
        return None
    held = cache.reports.get(beat.node)
    if held is None or held.digest != beat.digest or entry.name != beat.node:
        return None
    held = _merged(held, beat)
    found = steady_from(cache, heartbeats, entry, held, peer)
    if found is None:
        return None
    answer, hit, sources = found
    cache.hold(entry.name, held)
    # as jsonify writes it: compact, one line
    body = current_app.json.dumps(HeartbeatAnswer(answer=answer).to_json(),
                                  separators=(",", ":")).encode() + b"\n"
    cache.remember(Answered(raw, peer, entry, held, hit, sources, config.report_interval_s,
                            body))
    return body


def repeated(ext: Any, config: Any, token_hash: str, raw: bytes,
             peer: str | None) -> bytes | None:
    """The answer to a heartbeat that repeats, byte for byte and from the same address, the
    last one :func:`steady_heartbeat` answered for its node, while what answered it is still
    what the caches hold (``Answered``): the same bytes, without parsing or deciding it
    again; None otherwise. ``ext``: the app's extensions (no app context needed)."""
    cache: ReportCache = ext["llmgw.reports"]
    db: Any = ext["llmgw.store"]
    if cache.current(db) is None:
        return None
    entry = cache.nodes.get(token_hash)
    last: Answered | None = cache.answered.get(entry.name) if entry is not None else None
    if (last is None or last.raw != raw or last.peer != peer or last.entry is not entry
            or last.held is not cache.reports.get(entry.name)
            or last.hit is not cache.answers.get(entry.name) or last.sources is not cache.sources
            or last.interval_s != config.report_interval_s
            or address_checks(ext, config)(last.held.report.address, peer) != entry.problem):
        return None
    ext["llmgw.heartbeats"].put(entry.name, db.clock_cached(), last.held.devices)
    return last.body


def _from_memory(cache: ReportCache, heartbeats: Heartbeats, entry: NodeEntry, held: Held,
                 peer: str | None) -> HeartbeatAnswer | None:
    """The heartbeat's answer from the caches (:func:`steady`), its merged report then
    held; None when it must be written."""
    answer = steady(cache, heartbeats, entry, held, peer)
    if answer is None:
        return None
    cache.hold(entry.name, held)
    return HeartbeatAnswer(answer=answer)


def _same_node(principal: str, named: str) -> None:
    if principal != named:
        raise ForbiddenError(f"this credential belongs to node {principal!r}, not {named!r}")


def _unique(beat: Heartbeat) -> None:
    """Replica and device ids appear once each, as in a report."""
    problems = [p for p in (twice("replicas", beat.replicas), twice("devices", beat.devices))
                if p is not None]
    if problems:
        raise ValidationError("the heartbeat is malformed; nothing of it was used",
                              details=problems)


def _merged(held: Held, beat: Heartbeat) -> Held:
    """The held report with the heartbeat's replicas and devices, where it has them."""
    update: dict[str, Any] = {}
    if beat.replicas is not None:
        update["replicas"] = list(beat.replicas)
    if beat.devices is not None:
        update["devices"] = list(beat.devices)
    if not update:
        return held
    report = held.report.model_copy(update=update)
    devices = repo.devices_of(report) if beat.devices is not None else held.devices
    return Held(held.digest, report, held.inventory, devices)


class AddressChecks:
    """``identity.address_problem`` for this app's networks, remembered per (claimed IP
    address, address the request came from): a pure function of those, asked at every
    report and heartbeat. A claimed host name is resolved each time (the resolver caches
    names for a while) and its answer not remembered."""

    LIMIT = 20_000

    def __init__(self, networks: Any, resolver: Resolver) -> None:
        self.networks, self.resolver = networks, resolver
        self.known: dict[tuple[str | None, str | None], str | None] = {}

    def __call__(self, claimed: str | None, peer: str | None) -> str | None:
        key = (claimed, peer)
        if key in self.known:
            return self.known[key]
        if claimed and not identity.is_ip(claimed):
            return identity.address_problem(claimed, peer, self.resolver(claimed),
                                            self.networks)
        problem = identity.address_problem(claimed, peer, (), self.networks)
        if len(self.known) >= self.LIMIT:
            self.known.clear()
        self.known[key] = problem
        return problem


def problem_of(report: Report, config: Any, peer: str | None) -> str | None:
    """What of the report (sent from ``peer``) is not used (its address), or the agent
    saying it stops."""
    if report.stopping:
        return ("its agent stopped and stopped its engines; the node is not used until "
                "the agent runs again")
    return address_checks(current_app.extensions, config)(report.address, peer)


def address_checks(ext: Any, config: Any) -> AddressChecks:
    """The app's :class:`AddressChecks` (``ext``: its extensions), made at first use."""
    checks: AddressChecks | None = ext.get("llmgw.address_checks")
    if checks is None:
        checks = ext["llmgw.address_checks"] = AddressChecks(config.agent_network_list,
                                                             ext["llmgw.resolver"])
    return checks


def steady(cache: ReportCache, heartbeats: Heartbeats, entry: NodeEntry, held: Held,
           peer: str | None) -> ReportAnswer | None:
    """The answer to a report (sent from ``peer``) that repeats what is stored, from this
    process's caches, its last report time and devices left to the heartbeat writer; None
    when the report must be handled in a transaction."""
    found = steady_from(cache, heartbeats, entry, held, peer)
    return None if found is None else found[0]


def steady_from(cache: ReportCache, heartbeats: Heartbeats, entry: NodeEntry, held: Held,
                peer: str | None) -> tuple[ReportAnswer, Answer, tuple[list[str], str]] | None:
    """:func:`steady`'s answer with the cached answer and sources it was made from."""
    report, config = held.report, current_app.config["LLMGW"]
    if report.node != entry.name or report.stopping:
        return None
    problem = problem_of(report, config, peer)
    address = report.address if problem is None else None
    if problem != entry.problem or address != entry.address or held.inventory != entry.inventory:
        return None
    hit = cache.answer(entry.name, devices_key(report.devices))
    sources = cache.sources
    if hit is None or sources is None:
        return None
    if not unchanged(hit.heads, hit.parts, {r.id: r for r in report.replicas}):
        return None
    g.principal_kind, g.principal = "node", entry.name
    heartbeats.put(entry.name, store().clock_cached(), held.devices)
    return (report_answer(report, config.report_interval_s, hit.assignments, problem, sources),
            hit, sources)


def in_transaction(held: Held | None, raw: bytes | None) -> ReportAnswer:
    """The report (``held``, else parsed from ``raw`` once the credential is checked)
    written and answered in one transaction; what it read is cached afterwards."""
    cache, heartbeats = caches()
    token_hash, config = g.token_hash, current_app.config["LLMGW"]
    kept: dict[str, Any] = {}

    def write(conn: Any) -> ReportAnswer:
        # Idempotent (the report states what is, the answer is re-read): retried through
        # a store failover, so agents see a pause rather than errors.
        authenticate(conn)
        got = held if held is not None else held_of(
            parse_json(Report, raw or b"", what="report"), report_digest(raw or b""))
        report = got.report
        node, before = g.principal, g.node_row           # as stored before this report
        _same_node(node, report.node)
        problem = problem_of(report, config, request.remote_addr)
        reported = {r.id: r for r in report.replicas}
        now = now_of(conn)
        heartbeats.drop(node)                            # this write supersedes it
        inventory = repo.record_report(conn, node, report, now, problem,
                                       alive=not report.stopping, before=before)
        if before.problem != problem:
            repo.add_event(conn, now, "node", node, problem or "the node's report is usable "
                           "in full again")
        heads = repo.list_replicas(conn, node=node)
        parts = repo.parts_on_node(conn, node)
        gone = apply_heads(conn, heads, reported, now)
        gone |= apply_parts(conn, parts, reported, now)
        assignments = assignments_for(
            conn, report.devices,
            heads=[r for r in heads if r.id not in gone],
            parts=[p for p in parts if part_id(p.replica_id, p.rank) not in gone])
        sources = cache.catalog_sources(conn)
        kept.update(node=node, held=got, stamp=before.generation, entry=NodeEntry(
            node, report.address if problem is None else None, problem, inventory),
            answer=Answer(devices_key(report.devices), heads, parts, assignments,
                          frozenset(a.model for a in assignments)), sources=sources)
        return report_answer(report, config.report_interval_s, assignments, problem,
                             sources)

    answer = store().write(write)
    node, got = kept["node"], kept["held"]
    if got.report.stopping:                    # its next report comes in full
        cache.reports.pop(node, None)
    else:
        cache.put(kept["stamp"], token_hash, kept["entry"], kept["answer"], kept["sources"])
        cache.hold(node, got)
    return answer
