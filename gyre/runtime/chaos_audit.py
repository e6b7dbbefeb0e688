"""What a run's own files say about how it came through its faults (the chaos test's and
``bench/bench_chaos.py``'s verdicts), read from the run directory and nothing else.

* **restarting at end**: kills found and acted on by a restart whose new process had not
  served yet when the run finished its steps (a restart takes seconds; a late kill may not
  see it through);
* **interrupted, other**: failed executions whose harness the nemesis did not kill, and 5xx
  answers (``summary.json`` ``interrupted_executions`` less the killed ones);
* **relaunched** and **finished lost**: an (group, attempt) run more than once, and the
  ones of those whose earlier run had finished unfailed (thrown away);
* **trained twice** / **incomplete**: a group in two steps' ``groups``; a trained group
  without one row per attempt in ``executions.jsonl``;
* **answered missing**: per finished execution, calls the proxy counted answered (its tally,
  in the execution's row) less the trace's answered records (an ``abort`` record is a call
  whose client was cut: not answered); and the proxy's answered counter less every answered
  record of the run.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any


def _jsonl(p: Path) -> list[dict[str, Any]]:
    if not p.exists():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def answered_records(traces: Path, since: float = 0.0) -> Counter:
    """Answered trace records per execution (``abort`` records left out), of calls that
    ended at Unix time ``since`` or later."""
    out: Counter = Counter()
    for p in traces.rglob("*.jsonl"):
        for r in _jsonl(p):
            if r.get("finish_reason") != "abort" and r.get("t_end", 0.0) >= since:
                out[r["execution_id"]] += 1
    return out


def segment_start(faults: list[dict[str, Any]]) -> float:
    """When the last segment began (its core restart), as Unix time; 0 with one segment. Its
    proxy is new, so its ``answered`` counter counts the calls answered since then."""
    return max([f["restart_unix_time"] for f in faults if f.get("restart_unix_time")] + [0.0])


def audit(rd: Path, group_size: int) -> dict[str, Any]:
    s = json.loads((rd / "summary.json").read_text())
    rows = _jsonl(rd / "executions.jsonl")
    killed = {
        k["target"]["execution"] for k in s.get("chaos", []) if "execution" in k.get("target", {})
    }
    runs = Counter((r["group"], r["attempt"]) for r in rows)
    lost = 0
    seen: dict[tuple[int, int], bool] = {}
    for r in rows:
        key = (r["group"], r["attempt"])
        if key in seen and seen[key]:
            lost += 1  # it had finished, and was run again
        seen[key] = seen.get(key, False) or not r["failed"]
    trained = [int(g[1:]) for m in _jsonl(rd / "metrics.jsonl") for g in m["groups"]]
    by_group = Counter(r["group"] for r in rows)
    rec = answered_records(rd / "traces")
    calls_missing = sum(
        max(0, r["model_calls"]["answered"] - rec[r["execution"]])
        for r in rows
        if r.get("model_calls") and not r["failed"]
    )
    failed_other = sum(1 for r in rows if r["failed"] and r["execution"] not in killed)
    kills = [k for k in s.get("chaos", []) if "target" in k]
    return {
        "steps": s["steps"],
        "kills": Counter(k["kind"] for k in kills),
        "skipped": sum(1 for k in s.get("chaos", []) if "skipped" in k),
        "handled": sum(1 for k in kills if k.get("handled")),
        # found and restarted, but the run ended before the new process served (only the last
        # kill can be: the nemesis waits for each kill's handling before the next)
        "restarting_at_end": sum(
            1 for k in kills if not k.get("handled") and k.get("action") == "restart"
        ),
        "killed_harnesses": len(killed),
        "interrupted_other": failed_other + int(s["proxy"].get("errors_5xx", 0)),
        "relaunched": sum(n - 1 for n in runs.values() if n > 1),
        # executions running when a core restart ended their segment (cut; no row of theirs)
        "cut_by_core_restart": sum(
            f.get("executions_cut", 0) for f in s["faults"] if f.get("core_restart")
        ),
        "finished_lost": lost,
        "trained_twice": len(trained) - len(set(trained)),
        "incomplete_groups": sum(1 for g in set(trained) if by_group[g] < group_size),
        "answered_missing": calls_missing,
        # the proxy's counter (this segment's, carried across its restarts) vs the segment's
        # trace records (a segment's calls all end before the next segment starts)
        "answered_counter_gap": int(s["proxy"]["answered"])
        - sum(answered_records(rd / "traces", segment_start(s["faults"])).values()),
        "proxy_restarts": sum(1 for f in s["faults"] if f["kind"] == "proxy"),
        "makespan_s": s["makespan_s"],
        "chaos": s.get("chaos", []),
        "faults": s["faults"],
    }
