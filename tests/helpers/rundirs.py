"""A run directory written file by file, in the layout ``gyre run`` writes
(gyre/runtime/rundir.py): for the ``gyre runs`` tests."""

from __future__ import annotations

import json
from pathlib import Path

TRACE = {
    "request_id": "q0", "seq": 0, "api": "openai.chat", "base": None, "base_len": 0,
    "input_suffix": [1, 5, 7, 9], "output_ids": [11, 12, 2], "output_logprobs": [-0.1, -0.2, -0.3],
    "segments": [{"start": 0, "end": 3, "engine_id": "cell-0", "weights_version": 1}],
    "finish_reason": "stop", "forked": False, "t_start": 1.0, "t_end": 2.0, "meta": {}, "format": 1,
}  # fmt: skip


def make_run(root: Path, name: str, *, steps: int, total: int, finished: bool, ckpt: bool,
             placement: str = "elastic", mismatch: bool = True) -> Path:  # fmt: skip
    rd = root / name
    (rd / "traces").mkdir(parents=True)
    cfg = {
        "model_dir": str(root / "no-model"),
        "policy": {"placement": placement, "total_steps": total},
    }
    (rd / "config.json").write_text(json.dumps(cfg))
    (rd / "config.toml").write_text(f'[policy]\nplacement = "{placement}"\ntotal_steps = {total}\n')
    rows = []
    for s in range(steps):
        row = {"step": s, "version": s + 1, "reward/mean": 0.18275158180271042 + 0.01 * s,
               "reward/pass_rate": 0.1 * s, "batch/staleness_mean": 0.5 * s,
               "batch/staleness_max": s, "cells/0/rollout_share": 0.6, "cells/0/training_share": 0.4}  # fmt: skip
        if mismatch:
            row |= {"mismatch/kl_same_version": 1e-4 * s, "mismatch/kl_other_version": 2e-4 * s}
        rows.append(row)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (rd / "metrics.jsonl").write_text(text + '{"step": 99, "rew')  # a torn last line
    (rd / "evals.jsonl").write_text(
        json.dumps({"version": 0, "reward_mean": 0.2, "pass_rate": 0.0}) + "\n"
        + json.dumps({"version": steps, "reward_mean": 0.3, "pass_rate": 0.25}) + "\n"
    )  # fmt: skip
    execs = [
        {"execution": "r0-g00000-a00", "task": "t1", "reward": 0.5, "missing": None,
         "seconds": 12.25, "model_calls": {"attempted": 3, "answered": 3}, "harness_stop": "exited"},
        {"execution": "r0-g00000-a01", "task": "t1<b>", "reward": None, "missing": "model_unreachable",
         "seconds": 30.0, "model_calls": {"attempted": 1, "answered": 0}, "harness_stop": "harness_timeout",
         "error": "engine <gone>"},
    ]  # fmt: skip
    (rd / "executions.jsonl").write_text("".join(json.dumps(e) + "\n" for e in execs))
    (rd / "traces" / "r0-g00000-a00.jsonl").write_text(
        json.dumps({"execution_id": "r0-g00000-a00", **TRACE}) + "\n"
    )
    if ckpt:
        (rd / "checkpoints" / "step-1").mkdir(parents=True)
        (rd / "checkpoints" / "step-1" / "trainer_state.json").write_text("{}")
        (rd / "checkpoints" / "step-2").mkdir()  # never finished writing: not a checkpoint
    if finished:
        summary = {"placement": placement, "makespan_s": 123.456, "steps": steps,
                   "executions": {"finished": 1, "failed": 0, "missing": 1,
                                  "missing_by_reason": {"model_unreachable": 1}},
                   "proxy": {"moved_calls": 7, "resumed_with_partial_output": 2},
                   "interrupted_executions": 1, "dead_engines": [],
                   "role_shares": [{"rollout": 0.7, "to_training": 0.05, "training": 0.25}]}  # fmt: skip
        (rd / "summary.json").write_text(json.dumps(summary))
    return rd
