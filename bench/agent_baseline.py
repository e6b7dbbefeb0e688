"""The base model on the tool-use task, with and without the tool: held-out accuracy and how
often it calls the tool, through the real stack (engine, proxy, reference agent, verifier).

    python bench/agent_baseline.py [--held-out 32] [--family calc] [--out runs/agent-baseline]
    python bench/agent_baseline.py --summarize RUN_DIR [RUN_DIR ...]

Each condition is one ``gyre run`` of ``examples/smollm2-agent.toml``, one training step at
lr 1e-12 (the weights stay those of the base model to ~1e-12), so its two evaluations
(version 0 at the start, version 1 at the end) are two independent samples of the base model
on the held-out split at temperature 1; ``evals.jsonl`` is the run's own record of them.
The harness timeout is raised to 900 s so that a loaded machine does not cut executions.

- ``tool``: the example as shipped (fenced-bash protocol, worked exchange, up to 4 turns);
- ``no-tool``: the same instruction, one reply, no tools and no system prompt, the model's
  own chat template (``runs/smollm2``), as ``examples/smollm2-arith.toml`` runs.

Tool-call rate: the share of evaluation executions with at least one tool call, counted by
running the proxy's ``bash`` parser over each recorded reply (trace records), so a call
counts whether or not the agent got to run it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "smollm2-agent.toml"
NO_TOOL_ARGS = ["--max-turns", "1", "--max-tokens", "64", "--no-tools", "--system", ""]
NO_TOOL_ARGS += ["--client", "stdlib"]


def _jsonl(p: Path) -> list[dict]:
    if not p.is_file():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def run_condition(name: str, tasks: Path, out: Path, extra: list[str]) -> Path:
    sets = [
        f"run.taskset={tasks}",
        f"run.out_dir={out}",
        f"run.name={name}",
        "policy.total_steps=1",
        "policy.batch_groups=1",
        "policy.group_size=2",
        "trainer.optim.lr=1e-12",
        "run.eval_interval=1",
        "run.eval_attempts=1",
        # the model is measured, not the machine: a call that waits for a loaded CPU is not
        # cut (the example's 90 s would score such an execution 0)
        "run.harness_timeout_s=900",
        *extra,
    ]
    argv = [sys.executable, "-m", "gyre.cli", "run", str(EXAMPLE), "--log-format", "plain"]
    for s in sets:
        argv += ["--set", s]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    subprocess.run(argv, check=True, env=env, cwd=ROOT)
    return out / name


def summarize(run: Path) -> dict:
    """Accuracy, mean reward, tool-call rate and calls per execution over the run's evaluations."""
    from transformers import AutoTokenizer  # heavy: only when summarizing

    from gyre.proxy.parsing import make_parser

    cfg = json.loads((run / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(ROOT / cfg["model_dir"])
    rewards: list[float] = []
    for row in _jsonl(run / "evals.jsonl"):
        for vals in (row.get("per_task") or {}).values():
            rewards += [r for r in vals if r is not None]
    calls, requests = Counter[int](), Counter[int]()
    for tr in sorted((run / "traces").glob("*-eval-*.jsonl")):
        recs = _jsonl(tr)
        n = 0
        for r in recs:
            p = make_parser("bash", str)
            events = p.feed(str(tok.decode(r["output_ids"], skip_special_tokens=True))) + p.finish()
            n += sum(1 for e in events if type(e).__name__ == "ToolCallEvent")
        calls[n] += 1
        requests[len(recs)] += 1
    n_exec = sum(calls.values())
    return {
        "run": str(run),
        "samples": len(rewards),
        "accuracy": sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else None,
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "formatted (reward > 0)": sum(1 for r in rewards if r > 0) / len(rewards)
        if rewards
        else None,
        "tool_call_rate": sum(v for k, v in calls.items() if k > 0) / n_exec if n_exec else None,
        "tool_calls_per_execution": sum(k * v for k, v in calls.items()) / n_exec
        if n_exec
        else None,
        "model_calls_distribution": dict(sorted(requests.items())),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="calc")
    ap.add_argument("--held-out", type=int, default=32)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "agent-baseline")
    ap.add_argument("--summarize", nargs="*", type=Path)
    ap.add_argument(
        "--conditions", nargs="+", choices=["tool", "no-tool"], default=["tool", "no-tool"]
    )
    a = ap.parse_args()
    if a.summarize:
        for run in a.summarize:
            print(json.dumps(summarize(run)))
        return 0
    from gyre.harness.families import problems
    from gyre.harness.families.write import write_taskset

    tasks = a.out / "tasks"
    if not tasks.is_dir():  # the example's held-out problems (seed 0), a few train ones
        write_taskset(
            problems(a.family, 0, "train", 4) + problems(a.family, 0, "held-out", a.held_out),
            tasks,
        )
    extra = {
        "tool": [],
        "no-tool": [
            "model_dir=runs/smollm2",
            "proxy.parser=plain",
            "run.harness_args=" + json.dumps(NO_TOOL_ARGS),
        ],
    }
    runs = [run_condition(c, tasks, a.out, extra[c]) for c in a.conditions]
    for run in runs:
        print(json.dumps(summarize(run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
