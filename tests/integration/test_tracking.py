"""The tracking sinks with the real libraries, offline: W&B in offline mode, MLflow's
sqlite store in the run directory. Rows go in as ``gyre run`` writes them (metrics.jsonl,
evals.jsonl lines); the test then reads what the libraries wrote to disk."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from helpers.trackfiles import wandb_runs

pytest.importorskip("wandb")
pytest.importorskip("mlflow")

from gyre.runtime.tracking import STATE, Tracker, numeric
from gyre.runtime.tracking_config import TrackingConfig

CONFIG = {"policy": {"placement": "elastic", "cells": 3}, "run": {"name": "t", "tracking": {}}}


def _row(step: int) -> dict:
    return {
        "step": step,
        "version": step + 1,
        "reward/mean": 0.1 * step,
        "batch/staleness_max": step % 2,
        "tools/by_profile/claude-code/turns_per_execution": 2.5,
        "train/claims": {"0": 2, "1": 1},
        "groups": ["g0"],
        "actor/loss": None,
    }


def _append(path: Path, rows: list[dict], torn: str = "") -> None:
    with path.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows) + torn)


def test_numeric_keeps_metrics_jsonl_names():
    assert numeric(_row(2)) == {
        "step": 2.0,
        "version": 3.0,
        "reward/mean": pytest.approx(0.2),
        "batch/staleness_max": 0.0,
        "tools/by_profile/claude-code/turns_per_execution": 2.5,
        "train/claims/0": 2.0,
        "train/claims/1": 1.0,
    }


@pytest.mark.slow
def test_wandb_offline_and_mlflow_sqlite_then_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    rd = tmp_path / "run"
    rd.mkdir()
    cfg = TrackingConfig(sinks=["wandb", "mlflow"], project="gyre-test", interval_s=3600)
    warnings: list[str] = []
    t = Tracker(cfg, rd, CONFIG, warnings.append)
    # a run evaluates version 0 before its first step: that must not push step 0 out of W&B
    _append(rd / "evals.jsonl", [{"version": 0, "reward_mean": 0.25, "per_task": {"a": [0.5]}}])
    assert t.poll() == 0
    _append(rd / "metrics.jsonl", [_row(0), _row(1)], torn='{"step": 2, "rew')
    assert t.poll() == 2
    assert t.poll() == 0  # nothing new: nothing sent twice
    t.close(None)  # stopped early: no summary
    state = json.loads((rd / STATE).read_text())
    assert state["last_step"] == 1 and state["evals"] == 1

    # --resume: the checkpoint held step 1 only; metrics.jsonl is cut back and the run goes on
    (rd / "metrics.jsonl").write_text(json.dumps(_row(0)) + "\n" + json.dumps(_row(1)) + "\n")
    t = Tracker(cfg, rd, CONFIG, warnings.append)
    _append(rd / "metrics.jsonl", [_row(2), _row(3)])
    _append(rd / "evals.jsonl", [{"version": 4, "reward_mean": 0.5}])
    t.close({"makespan_s": 12.5, "steps": 4, "placement": "elastic"})
    assert warnings == []

    runs = wandb_runs(rd)
    assert len(runs) == 2 and runs[0]["id"] == runs[1]["id"] == state["wandb"]["run_id"]
    assert runs[0]["project"] == "gyre-test"
    assert runs[0]["config"]["policy"] == {"placement": "elastic", "cells": 3}
    steps = [h for r in runs for h in r["history"] if "reward/mean" in h]
    assert [h["_step"] for h in steps] == [0, 1, 2, 3]
    assert [h["reward/mean"] for h in steps] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert steps[0]["train/claims/0"] == 2
    assert steps[0]["tools/by_profile/claude-code/turns_per_execution"] == 2.5
    evals = [h for r in runs for h in r["history"] if "eval/reward_mean" in h]
    assert [(h["eval/version"], h["eval/reward_mean"]) for h in evals] == [(0, 0.25), (4, 0.5)]
    assert runs[1]["summary"]["summary/makespan_s"] == 12.5
    assert not (tmp_path / "wandb").exists() and not (tmp_path / "mlruns").exists()

    db = sqlite3.connect(rd / "mlflow.db")
    (run_id, status, name), *more = db.execute("SELECT run_uuid, status, name FROM runs").fetchall()
    assert not more and run_id == state["mlflow"]["run_id"] and name == "run"
    assert status == "FINISHED"
    got = db.execute(
        "SELECT step, value FROM metrics WHERE key = 'reward/mean' AND run_uuid = ? ORDER BY step",
        (run_id,),
    ).fetchall()
    assert got == [(0, 0.0), (1, 0.1), (2, 0.2), (3, pytest.approx(0.3))]
    key = "tools/by_profile/claude-code/turns_per_execution"  # a per-profile name MLflow takes
    assert db.execute("SELECT COUNT(*) FROM metrics WHERE key = ?", (key,)).fetchone() == (4,)
    ev = db.execute("SELECT step, value FROM metrics WHERE key = 'eval/reward_mean'").fetchall()
    assert sorted(ev) == [(0, 0.25), (4, 0.5)]
    params = dict(db.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,)))
    assert params["policy.placement"] == '"elastic"' and params["policy.cells"] == "3"
    arts = rd / "mlartifacts"
    summary = next(arts.rglob("summary.json"))
    assert json.loads(summary.read_text())["makespan_s"] == 12.5
    assert json.loads(next(arts.rglob("config.json")).read_text()) == CONFIG
