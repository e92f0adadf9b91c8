#!/usr/bin/env python3
"""Count the cluster scenario's requests (verify.yml) during an operation (the agents'
rolling restart, a node's maintenance): in all, during it, and per agent restart window.

    rollout_requests.py REQUESTS_FILE TIMES_JSON

REQUESTS_FILE: request_loop.sh's lines, "<unix time sent> <outcome>" (an HTTP status, or
"cut": a 200 that was not a whole answer); only "200" counts as answered.
TIMES_JSON: {"rollout": [start, end], "loop_stopped": t, "agents": [[name, show], ...],
"what": "rollout"}: unix times, what the operation is called in the report (default
"rollout"; the key "rollout" holds its times whatever it is), and for each agent (none for
an operation that restarts no agent) the output of
`systemctl show llmgw-agent.service --timestamp=us+utc -p ActiveExitTimestamp
-p ActiveEnterTimestamp`
(ActiveExitTimestamp: the old agent began to stop; ActiveEnterTimestamp: the new one runs).

Agent i's restart window runs from its stop to the next agent's stop (the last agent's: to
when the loop was told to stop, a while after the rollout): its restart, the new agent
adopting its engines, its first reports (the rollout's gate). Prints one JSON object:
the counts (sent, answered = HTTP 200, failed) in all, during the rollout and per window,
the windows' times, the first failures, and `report`, the same as lines for people.
"""

import json
import sys
from datetime import UTC, datetime


def unix(systemd_time: str) -> float | None:
    """A `systemctl show --timestamp=us+utc` time as unix seconds; None when unset."""
    text = systemd_time.strip()
    if not text or text == "n/a":
        return None
    moment = datetime.strptime(text, "%a %Y-%m-%d %H:%M:%S.%f UTC")
    return moment.replace(tzinfo=UTC).timestamp()


def counts(requests: list[tuple[float, str]], start: float, end: float) -> dict:
    inside = [code for sent, code in requests if start <= sent < end]
    answered = sum(1 for code in inside if code == "200")
    return {"sent": len(inside), "answered": answered, "failed": len(inside) - answered}


def describe(c: dict) -> str:
    return f"{c['sent']} sent, {c['answered']} answered, {c['failed']} failed"


def main(requests_file: str, times_json: str) -> None:
    times = json.loads(times_json)
    start, end = (float(t) for t in times["rollout"])
    what = times.get("what", "rollout")
    loop_stopped = float(times["loop_stopped"])
    requests = []
    with open(requests_file) as fh:
        for line in fh:
            sent, _, code = line.strip().partition(" ")
            if sent:
                requests.append((float(sent), code or "000"))
    requests.sort()

    agents = []
    for name, show in times["agents"]:
        props = dict(line.partition("=")[::2] for line in show.splitlines())
        agents.append({"name": name,
                       "stopped": unix(props.get("ActiveExitTimestamp", "")),
                       "started": unix(props.get("ActiveEnterTimestamp", ""))})
    agents.sort(key=lambda a: a["stopped"] or 0.0)

    windows = []
    for i, agent in enumerate(agents):
        w_from = agent["stopped"] or 0.0
        w_to = agents[i + 1]["stopped"] if i + 1 < len(agents) else loop_stopped
        windows.append({**agent, "from": w_from, "to": w_to or w_from,
                        **counts(requests, w_from, w_to or w_from)})

    total = counts(requests, float("-inf"), float("inf"))
    first = requests[0][0] if requests else None
    last = requests[-1][0] if requests else None
    failures = [f"{sent - start:+.1f} s {code}" for sent, code in requests if code != "200"]
    report = [f"all requests: {describe(total)}"
              + (f", from {start - first:.1f} s before the {what} to {last - end:.1f} s "
                 f"after it" if requests else ""),
              f"during the {end - start:.1f} s {what}: {describe(counts(requests, start, end))}"]
    for w in windows:
        if w["stopped"] is None:
            report.append(f"{w['name']}: systemd has no stop time for llmgw-agent")
            continue
        running = (f", running again {w['started'] - w['stopped']:.1f} s later"
                   if w["started"] else "")
        report.append(f"{w['name']} restart window, {w['to'] - w['from']:.1f} s from its stop "
                      f"({w['stopped'] - start:.1f} s into the {what}{running}): {describe(w)}")
    if failures:
        report.append(f"first failures (sent, from the {what}'s start; HTTP status or cut): "
                      + ", ".join(failures[:20]))
    print(json.dumps({**total, "first": first, "last": last,
                      "during_rollout": counts(requests, start, end),
                      "failures": failures[:20], "windows": windows, "report": report}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
