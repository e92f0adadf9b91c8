"""The fleet summary as terminal text: ``llmgw ctl status`` and ``llmgw-status``.

Pure: the summary (``status.summary.build``), a width and whether to colour in, text out.
Aggregates first, then only what needs the operator, each list capped so the screen reads
the same for 4 nodes and for 2,000; the full listings are ``ctl models``, ``ctl nodes``,
``ctl replicas``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..text import printable_doc
from .summary import AT_CAPACITY_S
from .tables import (
    MIN_WIDTH,
    Paint,
    bar,
    capped,
    clip,
    clip_painted,
    duration,
    fit,
    gigabytes,
    human_bytes,
    number,
    painter,
    plural,
    table,
)
from .telling import telling_line

SHOW_ALL_MODELS = 20       # up to this many models, every one is listed
LIST_CAP = 10              # longer lists end with "... and N more (command)"
FINE = ("ready", "idle")   # model states that need nobody
AT_CAPACITY = "at capacity"

STATE_COLOUR = {"ready": "green", "idle": "dim", "parked": "red", "unplaceable": "red",
                "failed": "red", "failing": "red", "starting": "yellow", "activating": "yellow",
                "pending": "yellow", "fetching": "yellow", "stopping": "dim",
                "stopped": "dim", "unreachable": "yellow"}

SECTIONS = ("head", "capacity", "fabrics", "models", "scaling", "changes", "problems", "idle",
            "store")


def render(summary: dict[str, Any], width: int = 100, color: bool = False,
           sections: Sequence[str] = SECTIONS) -> str:
    """The whole screen, each line at most ``max(width, 60)`` characters (plus colour codes).
    ``sections`` picks parts by name (``ctl plan`` shows capacity and fabrics). Every string
    of ``summary`` is shown through ``text.printable``: only our colour codes are raw."""
    width = max(width, MIN_WIDTH)
    paint = painter(color)
    # Names and messages from the fleet: no raw escapes (newlines stay for telling_line;
    # fit() shows any left inside a line as \x0a).
    summary = printable_doc(summary, keep_newlines=True)
    lines: list[str] = []
    parts = {"head": head, "capacity": capacity, "fabrics": fabrics, "models": models,
             "scaling": scaling, "changes": changes, "problems": problems, "idle": idle,
             "store": store}
    for section in (parts[name] for name in sections):
        block = section(summary, width, paint)
        if block:
            lines += block + [""]
    return "\n".join(fit(line, width) for line in lines).rstrip() + "\n"


def head(s: dict[str, Any], width: int, paint: Paint) -> list[str]:
    nodes = s["nodes"]
    text = f"nodes {number(nodes['reporting'])}/{number(nodes['total'])} reporting"
    if nodes["silent"]:
        text += " (" + paint(f"{number(nodes['silent'])} silent", "red") + ")"
    out = [paint(f"{number(nodes[k])} {k}", "yellow") for k in ("cordoned", "draining")
           if nodes.get(k)]
    text += "; " + ", ".join(out) if out else ""
    reps = s["replicas"]
    rep_text = ", ".join(paint(f"{k} {number(v)}", STATE_COLOUR.get(k, "dim"))
                         for k, v in reps.items()) or "none"
    if s.get("replicas_draining"):
        rep_text += " (" + paint(f"{number(s['replicas_draining'])} draining", "yellow") + ")"
    wanted = sum(m["wanted"] for m in s["models"])
    ready = sum(m["ready"] for m in s["models"])
    model_text = (f"models {number(len(s['models']))}: {plural(ready, 'replica')} ready "
                  f"of {number(wanted)} desired")
    return [clip_painted(text, width), clip_painted("replicas: " + rep_text, width),
            clip(model_text, width)]


def capacity(s: dict[str, Any], width: int, paint: Paint) -> list[str]:
    """Devices per class. A shared class (the CPU, or devices placed by memory_gb) shows
    memory in USED and FREE: a device running replicas may still take more."""
    devices = s["devices"]
    if not devices:
        return ["capacity: no devices reported"] + unusable(s, width)
    rows = []
    for klass, c in devices.items():
        usable = c["total"] - c["unreachable"]
        if c.get("shared"):
            mem = c["memory_total_mb"]
            pct = f"{100 * c['memory_used_mb'] / mem:.0f}%" if mem else "-"
            rows.append([klass + "*", number(c["total"]), gigabytes(c["memory_used_mb"]),
                         gigabytes(c["memory_free_mb"]), number(c["unhealthy"]),
                         number(c["unreachable"]), pct, c])
            continue
        pct = f"{100 * c['used'] / usable:.0f}%" if usable else "-"
        rows.append([klass, number(c["total"]), number(c["used"]), number(c["free"]),
                     number(c["unhealthy"]), number(c["unreachable"]), pct, c])
    headers = ["CLASS", "TOTAL", "USED", "FREE", "UNHEALTHY", "UNREACHABLE", "USED%", "USAGE"]
    fixed = 2 + sum(max(len(h), *(len(str(r[i])) for r in rows)) + 2
                    for i, h in enumerate(headers[:-1]))
    bar_width = max(0, min(32, width - fixed))
    for r in rows:
        c = r[-1]
        if c.get("shared"):     # memory used of the reachable healthy devices' memory
            r[-1] = bar(round(100 * c["memory_used_mb"] / c["memory_total_mb"])
                        if c["memory_total_mb"] else 0, 0, 100, bar_width)
        else:
            r[-1] = bar(c["used"], c["unhealthy"], c["total"] - c["unreachable"], bar_width)
    if bar_width < 5:
        headers, rows = headers[:-1], [r[:-1] for r in rows]

    def colour(col: int, text: str) -> str | None:
        return "red" if col in (4, 5) and text.strip() not in ("0", "") else None

    return (["capacity:"] + table(rows, headers, width, paint, colour) + shared_notes(s, width)
            + unusable(s, width))


def shared_notes(s: dict[str, Any], width: int) -> list[str]:
    """One line per shared class: what its USED and FREE mean, and how many replicas run."""
    out = []
    for klass, c in s["devices"].items():
        if c.get("shared"):
            reachable = c["total"] - c["unreachable"] - c["unhealthy"]
            out.append("  " + clip(
                f"* {klass}: {plural(c['replicas'], 'replica')} share "
                f"{plural(reachable, 'device')}; USED and FREE are memory "
                "(docs/operations.md, Sharing a device)", width - 2))
    return out


def unusable(s: dict[str, Any], width: int) -> list[str]:
    """Cards with no usable device (MIG on and nothing carved, a driver problem), capped."""
    cards, more = capped(s.get("cards_unusable") or [], LIST_CAP // 2,
                         "llmgw ctl nodes")
    if not cards:
        return []
    out = [clip(f"cards that can run nothing ({len(s['cards_unusable'])}):", width)]
    for card in cards:
        where = f"{card['node']} card {card['card']}" if card["card"] is not None \
            else card["node"]
        out.append("  " + clip(f"{where}: {card['problem']}", width - 2))
        if card.get("hint"):
            out.append("    " + clip(f"what to do: {card['hint']}", width - 4))
    return out + ([more] if more else [])


def fabrics(s: dict[str, Any], width: int, paint: Paint) -> list[str]:
    fabs = s.get("fabrics") or {}
    if not fabs:
        return []
    rows = [(name, f"{number(f['reporting'])}/{number(f['nodes'])}", number(f["free_nodes"]),
             models_list(f["models"])) for name, f in fabs.items()]
    shown, more = capped(rows, LIST_CAP * 2, "llmgw ctl status -o json")
    return (["fabrics:"] + table(shown, ("FABRIC", "NODES", "FREE NODES", "HOLDS WEIGHTS OF"),
                                 width, paint) + ([more] if more else []))


def models_list(names: list[str], cap: int = 6) -> str:
    if not names:
        return "-"
    head_ = ", ".join(names[:cap])
    return head_ + (f" (+{len(names) - cap})" if len(names) > cap else "")


def models(s: dict[str, Any], width: int, paint: Paint) -> list[str]:
    all_models = s["models"]
    if not all_models:
        return ["models: the catalog is empty (llmgw ctl apply -f catalog.yml)"]
    if len(all_models) <= SHOW_ALL_MODELS:
        listed, title = all_models, "models:"
    else:
        listed = [m for m in all_models if m["state"] not in FINE or m.get("at_capacity")
                  or m.get("rollout")]
        fine = len(all_models) - len(listed)
        title = (f"models: {number(fine)} of {number(len(all_models))} ready or idle; "
                 "the others:")
        if not listed:
            return [clip(f"models: all {number(len(all_models))} ready or idle", width)]
    rows = [(m["name"], model_state(m), f"{m['ready']}/{m['wanted']}",
             ",".join(m.get("fabrics_with_weights") or []) or "-", model_reason(m))
            for m in listed]
    shown, more = capped(rows, max(LIST_CAP, SHOW_ALL_MODELS), "llmgw ctl models")

    def colour(col: int, text: str) -> str | None:
        if col == 1 and AT_CAPACITY in text:
            return "yellow"
        return STATE_COLOUR.get(text.split(" ")[0]) if col == 1 else None

    return ([clip(title, width)]
            + table(shown, ("MODEL", "STATE", "READY", "WEIGHTS IN", "REASON"), width, paint,
                    colour) + ([more] if more else []))


def model_state(m: dict[str, Any]) -> str:
    """``ready``, ``ready (on demand)``, ``ready, at capacity``, ``ready, rolling 1/2``,
    ``ready, canary 10 %``, ``ready, rollout failed`` (the error: ``changes``), ``failing
    (3 in a row, next start in 20 s)`` (the last error: the reason)."""
    roll, failing = m.get("rollout"), m.get("failing")
    return ((failing["text"] if failing else m["state"])
            + (" (on demand)" if m["on_demand"] else "")
            + (f", {AT_CAPACITY}" if m.get("at_capacity") else "")
            + ("" if not roll else ", rollout failed" if roll["state"] == "failed"
               else f", {roll['text']}"))


def model_reason(m: dict[str, Any]) -> str:
    """The reason, after what routers said at capacity when they did."""
    full = m.get("at_capacity")
    reason = telling_line(m["reason"]) if m["reason"] else ""
    if not full:
        return reason
    return full["note"] + (f"; {reason}" if reason else "")


def scaling(s: dict[str, Any], width: int, paint: Paint) -> list[str]:
    """Models with a replica range: ready / target (min-max), the signal, and what the
    autoscaler is waiting for or could not do (docs/autoscaling.md)."""
    scaled = [m for m in s["models"] if m.get("scaling")]
    if not scaled:
        return []
    rows = []
    for m in scaled:
        c = m["scaling"]
        blocked = c["blocked"] and c["up_for_s"] is not None
        note = (f"no room for another replica: {c['blocked']}; " if blocked else "") + c["note"]
        rows.append((m["name"], f"{c['current']}/{c['target']} ({c['min']}-{c['max']})",
                     scaling_window(c), note))
    shown, more = capped(rows, LIST_CAP, "llmgw ctl status -o json")

    def colour(col: int, text: str) -> str | None:
        return "yellow" if col == 2 and text.startswith(("up", "blocked", "at max")) else None

    return (["autoscaling:"]
            + table(shown, ("MODEL", "READY/TARGET (MIN-MAX)", "NEXT", "SIGNAL"), width,
                    paint, colour) + ([more] if more else []))


def scaling_window(c: dict[str, Any]) -> str:
    """``up in 20s``, ``up pending`` (a replica starting, or the cooldown), ``at max``,
    ``blocked`` (no room for another replica), ``down in 4m``, or ``steady``."""
    settings = c["settings"]
    if c["up_for_s"] is not None:
        if c["target"] >= c["max"]:
            return "at max"
        if c["blocked"]:
            return "blocked"
        left = settings["up_after_s"] - c["up_for_s"]
        return f"up in {duration(left)}" if left > 0 else "up pending"
    if c["down_for_s"] is not None and c["target"] > max(c["min"], 1):
        left = settings["down_after_s"] - c["down_for_s"]
        return f"down in {duration(left)}" if left > 0 else "down pending"
    return "steady"


def changes(s: dict[str, Any], width: int, paint: Paint) -> list[str]:
    """Models in rollout (``rolling 1/2``, ``canary 10 %``, ``rollout failed: ...``) and
    nodes out of placement (cordoned, draining), each with how long or what is left."""
    out: list[str] = []
    rolls, more = capped(s.get("rollouts") or [], LIST_CAP, "llmgw ctl status -o json")
    if rolls:
        out.append(f"rollouts ({number(len(s['rollouts']))}): llmgw ctl rollout status MODEL")
        out += table([(r["name"], "-" if r["since"] is None else
                       duration(s["generated_at"] - r["since"]), r["text"]) for r in rolls],
                     ("MODEL", "FOR", "ROLLOUT"), width, paint,
                     lambda col, text: "red" if col == 2 and "failed" in text else None)
        out += [more] if more else []
    held, more = capped(s.get("maintenance") or [], LIST_CAP, "llmgw ctl nodes")
    if held:
        out += [""] if out else []
        out.append(f"nodes out of placement ({number(len(s['maintenance']))}): "
                   "llmgw ctl nodes uncordon NAME takes one back")
        out += table([(n["name"], n["state"], n["replicas"]) for n in held],
                     ("NODE", "STATE", "REPLICAS ON IT"), width, paint,
                     lambda col, text: "yellow" if col == 1 else None)
        out += [more] if more else []
    return out


def problems(s: dict[str, Any], width: int, paint: Paint) -> list[str]:
    out: list[str] = []
    if s.get("parked"):
        out.append(paint(f"parked ({number(len(s['parked']))}):", "red") + " "
                   + "llmgw ctl retry MODEL once the cause is fixed")
        rows, more = capped(s["parked"], LIST_CAP, "llmgw ctl models")
        out += table([(p["name"], f"{p['failures']} failures", telling_line(p["last_error"]))
                      for p in rows], ("MODEL", "FAILURES", "LAST ERROR"), width, paint)
        out += [more] if more else []
    if s.get("unplaceable"):
        if out:
            out.append("")
        out.append(paint(f"unplaceable ({number(len(s['unplaceable']))}):", "red"))
        rows, more = capped(s["unplaceable"], LIST_CAP, "llmgw ctl plan")
        out += table([(u["name"], u["reason"] or "") for u in rows], ("MODEL", "REASON"),
                     width, paint)
        out += [more] if more else []
    if s.get("at_capacity"):
        if out:
            out.append("")
        out.append(paint(f"at capacity ({number(len(s['at_capacity']))}):", "yellow") + " "
                   + "requests waited for a slot or were refused in the last "
                   + f"{AT_CAPACITY_S:g} s; add replicas or slots")
        rows, more = capped(s["at_capacity"], LIST_CAP, "llmgw ctl status -o json")
        out += table([(c["name"], c["waiting"], c["rejected"], f"{c['in_flight']}/{c['slots']}",
                       f"{c['wait_p90_s']:.1f}s", f"{duration(c['reported_s_ago'])} ago")
                      for c in rows],
                     ("MODEL", "WAITING", "REFUSED", "BUSY/SLOTS", "P90 WAIT", "REPORTED"),
                     width, paint)
        out += [more] if more else []
    found = s.get("node_problems") or {}
    if found.get("total"):
        if out:
            out.append("")
        out.append(paint(f"nodes with problems ({number(found['total'])}):", "red"))
        rows, _ = capped(found["nodes"], LIST_CAP, "")
        out += table([(n["name"], n["problem"]) for n in rows], ("NODE", "PROBLEM"), width,
                     paint)
        if found["total"] > len(rows):
            out.append(f"  ... and {number(found['total'] - len(rows))} more "
                       "(llmgw ctl status --nodes)")
    return out


def idle(s: dict[str, Any], width: int, paint: Paint) -> list[str]:
    data = s.get("idle") or {}
    reps, unknown = data.get("replicas") or [], data.get("unknown") or []
    headers = ("REPLICA", "MODEL", "IDLE", "DEVICES", "HOLDS")
    out: list[str] = []
    if reps:
        out.append(clip(f"idle: {plural(len(reps), 'replica')} holding "
                        f"{plural(data['cards'], 'device')}, unused for "
                        f"{duration(data['after_s'])} or more (what you could stop):", width))
        rows, more = capped(reps, LIST_CAP, "llmgw ctl status -o json")
        out += table([(r["id"], r["model"], duration(r["idle_s"]), r["cards"],
                       ",".join(r["devices"])) for r in rows], headers, width, paint)
        out += [more] if more else []
    if unknown:
        cards = data.get("unknown_cards", 0)
        out.append(clip(f"last use unknown (no router has reported a request for them): "
                        f"{plural(len(unknown), 'replica')}, {plural(cards, 'device')}", width))
        rows, more = capped(unknown, LIST_CAP // 2, "llmgw ctl status -o json")
        out += table([(r["id"], r["model"], "-", r["cards"], ",".join(r["devices"]))
                      for r in rows], headers, width, paint)
        out += [more] if more else []
    return out


def store(s: dict[str, Any], width: int, paint: Paint) -> list[str]:
    st = s.get("store") or {}
    members = st.get("members")
    if not members:
        return etcd_voters(st, width, paint)
    rows = []
    for m in members:
        if m.get("missing"):
            rows.append((m["name"], m.get("role") or "-", "MISSING", "-",
                         m.get("problem") or "its REST API does not answer"))
            continue
        lag = m.get("lag_bytes")
        rows.append((m["name"], m.get("role") or "-", m.get("state") or "-",
                     "-" if lag is None else human_bytes(lag), m.get("problem") or ""))

    def colour(col: int, text: str) -> str | None:
        if col == 2:
            t = text.strip()
            return "red" if t == "MISSING" or t == "stopped" else (
                "green" if t in ("running", "streaming") else "yellow")
        return None

    leader = [m for m in members if m.get("role") == "leader" and not m.get("missing")]
    title = f"store: {st.get('backend', '?')}, {len(members)} members"
    if not leader:
        title += ", " + paint("NO LEADER", "red")
    return [title] + table(rows, ("MEMBER", "ROLE", "STATE", "LAG", "PROBLEM"), width, paint,
                           colour) + etcd_voters(st, width, paint)


def etcd_voters(st: dict[str, Any], width: int, paint: Paint) -> list[str]:
    """The store's etcd voters (Patroni's leader key), each healthy by etcd's /health."""
    voters = st.get("voters")
    if not voters:
        return []
    rows = [(v["name"], "healthy" if v.get("healthy") else "UNHEALTHY",
             ", ".join(v.get("client_urls") or []) or "-", v.get("problem") or "")
            for v in voters]
    bad = sum(1 for v in voters if not v.get("healthy"))
    title = f"etcd: {len(voters)} voters" + (
        ", " + paint(f"{bad} UNHEALTHY", "red") if bad else "")
    return [title] + table(rows, ("VOTER", "HEALTH", "CLIENT URLS", "PROBLEM"), width, paint,
                           lambda col, text: ("green" if text.strip() == "healthy" else "red")
                           if col == 1 else None)
