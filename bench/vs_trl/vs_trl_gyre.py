"""Each side's raw output -> one normalised result (what vs_trl_lib compares).

Gyre: the run directory (metrics.jsonl, evals.jsonl, executions.jsonl, traces/,
summary.json). TRL: the JSON bench/vs_trl/trl_side.py wrote. Both get the same fields: evals
(step, time since training began, accuracy), steps, training wall-clock, prompt and
completion tokens of the training generations, peak memory and CPU of the process tree.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any


def _jsonl(p: Path) -> list[dict[str, Any]]:
    if not p.is_file():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass  # a torn last line
    return out


def _trace_calls(traces: Path) -> dict[str, list[dict[str, Any]]]:
    """execution id -> its trace records (prompt length, completion length, call seconds)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for f in sorted(traces.glob("*.jsonl")):
        for r in _jsonl(f):
            out.setdefault(r["execution_id"], []).append(
                {
                    "prompt": r.get("base_len", 0) + len(r.get("input_suffix", [])),
                    "completion": len(r.get("output_ids", [])),
                    "seconds": r["t_end"] - r["t_start"],
                    "base": r.get("base"),
                    "input_suffix": r.get("input_suffix", []),
                }
            )
    return out


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def harness_cost(executions: list[dict[str, Any]], calls: dict[str, list[dict]]) -> dict[str, Any]:
    """What running each execution as a harness process through the proxy costs beyond the
    model call: execution wall-clock (launch, the agent's start-up, the call, scoring) minus
    the call's time at the proxy (t_start..t_end of its record, engine generation included)."""
    over, share, call_s = [], [], []
    for e in executions:
        rec = calls.get(e["execution"])
        if not rec or e.get("seconds") is None:
            continue
        c = sum(r["seconds"] for r in rec)
        over.append(e["seconds"] - c)
        call_s.append(c)
        share.append((e["seconds"] - c) / e["seconds"] if e["seconds"] > 0 else 0.0)
    return {
        "executions": len(over),
        "overhead_s_median": _pct(over, 0.5),
        "overhead_s_p95": _pct(over, 0.95),
        "overhead_share_median": _pct(share, 0.5),
        "call_s_median": _pct(call_s, 0.5),
    }


def gyre_result(run_dir: Path, tree: dict[str, Any], seed: int) -> dict[str, Any]:
    metrics = _jsonl(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / "summary.json").read_text())
    when = {0: 0.0, **{m["version"]: m["time"] for m in metrics}}  # version v existed from then on
    evals = [
        {
            "step": e["version"],
            "time": when.get(e["version"]),
            "accuracy": e.get("pass_rate"),
            "reward_mean": e.get("reward_mean"),
        }
        for e in _jsonl(run_dir / "evals.jsonl")
        if "version" in e and "error" not in e
    ]
    calls = _trace_calls(run_dir / "traces")
    train_calls = [r for ex, rs in calls.items() if "-eval-" not in ex for r in rs]
    execs = [e for e in _jsonl(run_dir / "executions.jsonl") if "-eval-" not in e["execution"]]
    start = tree["t_marker"] - tree["t_popen"] if tree.get("t_marker") else None
    return {
        "side": "gyre",
        "seed": seed,
        "steps": len(metrics),
        "wall_s": summary.get("makespan_s"),
        "startup_s": start,
        "process_s": tree["process_s"],
        "evals": evals,
        "prompt_tokens": sum(r["prompt"] for r in train_calls),
        "completion_tokens": sum(r["completion"] for r in train_calls),
        "staleness_mean": statistics.fmean([m["batch/staleness_mean"] for m in metrics])
        if metrics
        else None,
        "train_reward": [m.get("reward/mean") for m in metrics],
        "clipfrac": [m.get("actor/pg_clipfrac") for m in metrics],
        "harness": harness_cost(execs, calls),
        "interrupted_executions": summary.get("interrupted_executions"),
        "tree": {k: v for k, v in tree.items() if k not in ("t_popen", "t_marker")},
        "peak_rss_mb": tree.get("peak_rss_mb"),
        "peak_pss_mb": tree.get("peak_pss_mb"),
        "run_dir": str(run_dir),
    }


def trl_result(raw: dict[str, Any], tree: dict[str, Any], seed: int) -> dict[str, Any]:
    steps = raw["steps"]
    eval_s = steps[-1]["eval_s"] if steps else 0.0  # the evaluations before the final one
    gen = sum(s["generation_s"] for s in steps)
    return {
        "side": "trl",
        "seed": seed,
        "steps": len(steps),
        "wall_s": raw["train_s"],
        "wall_without_eval_s": raw["train_s"] - eval_s if raw["train_s"] is not None else None,
        "eval_s": eval_s,
        "generation_s": gen,
        "startup_s": raw["t_train_begin"] - tree["t_popen"] if raw.get("t_train_begin") else None,
        "process_s": tree["process_s"],
        "evals": [
            {k: e[k] for k in ("step", "time", "accuracy", "reward_mean")} for e in raw["evals"]
        ],
        "prompt_tokens": sum(s["prompt_tokens"] for s in steps),
        "completion_tokens": sum(s["completion_tokens"] for s in steps),
        "staleness_mean": 0.0,
        "train_reward": [s["reward_mean"] for s in steps],
        "step_seconds": [s["seconds"] for s in steps],
        "clipfrac": [
            lg.get("clip_ratio/region_mean") for lg in raw.get("trl_logs", []) if "loss" in lg
        ],
        "ru_maxrss_mb": raw.get("ru_maxrss_mb"),
        "threads": raw.get("threads"),
        "tree": {k: v for k, v in tree.items() if k not in ("t_popen", "t_marker")},
        "peak_rss_mb": tree.get("peak_rss_mb"),
        "peak_pss_mb": tree.get("peak_pss_mb"),
        "first_prompts": raw.get("first_prompts"),
        "first_prompt_names": raw.get("first_prompt_names"),
    }


def prompt_check(run_dir: Path, trl: dict[str, Any]) -> dict[str, Any]:
    """Did TRL's first step see token for token the prompts Gyre's proxy rendered for the
    same problems? (Gyre's record of a first call holds its whole input in input_suffix.)"""
    calls = _trace_calls(run_dir / "traces")
    first: dict[str, list[int]] = {}
    for ex, rs in calls.items():
        for r in rs:
            if r["base"] is None and not ex.startswith("open-"):
                first.setdefault(ex, r["input_suffix"])
    by_task: dict[str, list[int]] = {}
    for e in _jsonl(run_dir / "executions.jsonl"):
        if e["execution"] in first:
            by_task.setdefault(e["task"], first[e["execution"]])
    same = compared = 0
    for name, ids in zip(trl.get("first_prompt_names") or [], trl.get("first_prompts") or []):
        g = by_task.get(f"train-{name}")
        if g is not None:
            compared += 1
            same += int(list(g) == list(ids))
    return {"seed": trl["seed"], "compared": compared, "identical": same}
