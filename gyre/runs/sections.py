"""The run report's sections, each from the run directory's files (see gyre/runs/show.py)."""

from __future__ import annotations

import html
import os
import re
from pathlib import Path
from typing import Any

from gyre.runs import safefs
from gyre.runs.files import Run, finite, read_jsonl
from gyre.runs.page import table
from gyre.runs.svg import Series, bar_rows, line_chart
from gyre.trace.record import segment_version

ROLE_COLORS = {
    "rollout": "#4C78A8",
    "training": "#F2B701",
    "to_training": "#9D9D9D",
    "to_rollout": "#BDBDBD",
    "lost": "#D62728",
}


def _points(rows: list[dict[str, Any]], x: str, key: str) -> list[tuple[float, float]]:
    """(x, value) of the rows where both are finite numbers (a non-finite value is missing)."""
    out = []
    for r in rows:
        xv, yv = finite(r.get(x)), finite(r.get(key))
        if isinstance(r.get(x), int) and xv is not None and yv is not None:
            out.append((xv, yv))
    return out


def per_step(run: Run, key: str) -> list[tuple[float, float]]:
    return _points(run.metrics, "step", key)


def held_out(run: Run, key: str) -> list[tuple[float, float]]:
    return _points(run.evals, "version", key)


def curves(run: Run) -> str:
    train = line_chart(
        "training reward per step",
        [
            ("reward/mean", per_step(run, "reward/mean")),
            ("pass rate", per_step(run, "reward/pass_rate")),
        ],
        "step",
    )
    evals = line_chart(
        "held-out score per policy version",
        [("reward_mean", held_out(run, "reward_mean")), ("pass_rate", held_out(run, "pass_rate"))],
        "version",
    )
    return train + evals


def roles(run: Run) -> str:
    shares = (run.summary or {}).get("role_shares")
    if not isinstance(shares, list) and run.metrics:  # a running run: the last step's shares
        last = run.metrics[-1]
        by_cell: dict[int, dict[str, float]] = {}
        for k, v in last.items():
            m = re.fullmatch(r"cells/(\d{1,4})/(\w+)_share", k)
            if m and finite(v) is not None:
                by_cell.setdefault(int(m.group(1)), {})[m.group(2)] = float(v)
        shares = [by_cell[c] for c in sorted(by_cell)]
    rows = [
        (f"cell {c}", {str(k): f for k, v in s.items() if (f := finite(v)) is not None})
        for c, s in enumerate(shares or [])
        if isinstance(s, dict)
    ]
    return bar_rows("time share of each role, per cell", rows, ROLE_COLORS)


def staleness(run: Run) -> str:
    return line_chart(
        "staleness of the trained groups (versions behind)",
        [
            ("mean", per_step(run, "batch/staleness_mean")),
            ("max", per_step(run, "batch/staleness_max")),
        ],
        "step",
    )


def mismatch(run: Run) -> str:
    keys = sorted({k for r in run.metrics for k in r if k.startswith("mismatch/")})
    if not keys:
        return '<p class="none">mismatch: not recorded in this run</p>'
    groups: dict[str, list[Series]] = {}
    for k in keys:  # one chart per quantity, the version classes (or model calls) as its series
        m = re.fullmatch(r"mismatch/(.+?)_(same|other)_version", k)
        t = re.fullmatch(r"mismatch/(.+?)_same_version_turn(.+)", k)
        if m:
            name, series = m.group(1), f"{m.group(2)} version"
        elif t:
            name, series = f"{t.group(1)} same version, by model call", f"call {t.group(2)}"
        else:
            name, series = k[len("mismatch/") :], k
        groups.setdefault(name, []).append((series, per_step(run, k)))
    return "".join(line_chart(f"mismatch: {n}", s, "step") for n, s in groups.items())


# the agent section's charts: (title, [(series label, metric)]), from docs/runtime.md
AGENT_CHARTS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        "turns per execution",
        [
            ("p10", "agent/turns_p10"),
            ("p50", "agent/turns_p50"),
            ("p90", "agent/turns_p90"),
            ("max", "agent/turns_max"),
        ],
    ),
    (
        "tool calls",
        [("per execution", "agent/tool_calls_per_exec_mean"), ("unparsed", "tools/unparsed")],
    ),
    (
        "executions cut at the harness timeout",
        [("cut", "agent/harness_timeout"), ("cut, scored", "agent/harness_timeout_scored")],
    ),
    ("trees: flat tokens over tree tokens", [("flat / tree", "tree/flat_over_tree")]),
]


def agent(run: Run) -> str:
    """Per step: turns, tool calls, harness cuts and tree sharing (``agent/*``, ``tree/*``)."""
    if not any(k.startswith(("agent/", "tree/")) for r in run.metrics for k in r):
        return '<p class="none">agent figures: not recorded in this run</p>'
    return "".join(
        line_chart(title, [(n, per_step(run, k)) for n, k in series], "step")
        for title, series in AGENT_CHARTS
    )


def faults(run: Run, execs: list[dict[str, Any]]) -> str:
    s = run.summary or {}
    proxy = s.get("proxy") or {}
    by_reason = (s.get("executions") or {}).get("missing_by_reason") or {}
    if not isinstance(by_reason, dict):
        by_reason = {}
    if not by_reason:
        for e in execs:
            if e.get("missing"):
                why = str(e["missing"])
                by_reason[why] = by_reason.get(why, 0) + 1
    items = [
        ("calls moved to another engine (reroutes)", proxy.get("moved_calls")),
        ("of those, moved with their K/V (no re-prefill)", proxy.get("kv_migrated_calls")),
        ("K/V bytes moved", proxy.get("kv_bytes")),
        ("calls resumed with partial output", proxy.get("resumed_with_partial_output")),
        ("engine errors", proxy.get("engine_errors")),
        ("proxy 5xx answers", proxy.get("errors_5xx")),
        ("interrupted executions", s.get("interrupted_executions")),
        ("dead engines", ", ".join(map(str, s.get("dead_engines") or [])) or 0 if s else None),
        ("failed executions", sum(1 for e in execs if e.get("failed"))),
        *((f"missing: {k}", v) for k, v in sorted(by_reason.items(), key=str)),
    ]
    rows = [[html.escape(k), html.escape("-" if v is None else str(v))] for k, v in items]
    errors = [e for e in execs if e.get("error")][:20]
    out = table(["", ""], rows, "faults")
    if errors:
        out += "<p>first errors:</p>" + table(
            ["execution", "error"],
            [
                [html.escape(str(e.get("execution", "?"))), html.escape(str(e["error"])[:300])]
                for e in errors
            ],
        )
    return out


def trace_versions(path: Path, root: Path) -> list[int]:
    """The policy versions that served an execution's tokens (its trace's segments)."""
    vs: set[int] = set()
    for rec in read_jsonl(path, root):
        segs = rec.get("segments")
        for seg in segs if isinstance(segs, list) else []:
            v = segment_version(seg) if isinstance(seg, dict) else None
            if isinstance(v, int):
                vs.add(v)
    return sorted(vs)


def write_trees(run: Run, execs: list[dict[str, Any]], out: Path, limit: int) -> dict[str, Path]:
    """Each execution's trajectory tree as HTML (the tree renderer of ``gyre tree show``),
    for the first ``limit`` executions with a trace; execution id -> file."""
    from gyre.trace.admission import admit
    from gyre.trace.roles import default_profile
    from gyre.trace.stats import load_tree, render_html

    decode = _decoder(run)
    made: dict[str, Path] = {}
    for e in execs:
        eid = str(e.get("execution", ""))
        trace = run.path / "traces" / f"{eid}.jsonl"
        if len(made) >= limit or not re.fullmatch(r"[\w.-]+", eid) or not trace.is_file():
            continue
        why = safefs.refusal(run.path, trace)
        if why is not None:  # a link out of the run, or a FIFO: its tree is not drawn
            safefs.warn(trace, why)
            continue
        tree = load_tree(trace, default_profile(), None)
        if not tree.requests:
            continue
        if not made and not safefs.own_dir(out):
            return made
        f = out / f"{eid}.html"
        safefs.write_text(f, render_html(tree, admit(tree, None, 0), decode=decode))
        made[eid] = f
    return made


def _decoder(run: Run):
    """Decode token ids with the run's tokenizer when its model directory is still there."""
    md = run.config.get("model_dir")
    if not isinstance(md, str) or not (Path(md) / "tokenizer_config.json").is_file():
        return None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(md, local_files_only=True)
    except Exception:  # an unreadable tokenizer only costs the node text
        return None
    return lambda ids: tok.decode(ids)


def executions(
    run: Run, execs: list[dict[str, Any]], trees: dict[str, Path], page_dir: Path
) -> str:
    if not execs:
        return '<p class="none">executions: none recorded yet</p>'
    rows = []
    for e in execs:
        eid = str(e.get("execution", "?"))
        calls = e.get("model_calls") or {}
        reward = finite(e.get("reward"))
        if reward is not None:
            outcome = f"{reward:.3f}"
        else:
            why = e.get("missing") or ("failed" if e.get("failed") else "-")
            outcome = f'<span class="missing">missing: {html.escape(str(why))}</span>'
        vs = trace_versions(run.path / "traces" / f"{eid}.jsonl", run.path)
        link = html.escape(eid)
        if eid in trees:
            rel = os.path.relpath(trees[eid], page_dir)
            link = f'<a href="{html.escape(rel)}">{link}</a>'
        secs = finite(e.get("seconds"))
        rows.append(
            [
                link,
                html.escape(str(e.get("task", "?"))),
                f'<span class="num">{secs:.1f}</span>' if secs is not None else "-",
                html.escape(f"{calls.get('answered', '-')}/{calls.get('attempted', '-')}"),
                outcome,
                html.escape(", ".join(map(str, vs)) or "-"),
                html.escape(str(e.get("harness_stop", "-"))),
            ]
        )
    head = [
        "execution",
        "task",
        "seconds",
        "calls answered/attempted",
        "reward",
        "version",
        "harness",
    ]
    return table(head, rows, "executions")
