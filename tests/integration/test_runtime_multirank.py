"""`gyre run` with multi-rank cells: K=2 elastic cells of G=2 ranks each (4 cell processes).

One short run of the quickstart's settings (test_runtime.CONFIG, 2 cells) with
``run.cell.devices = 2``: each cell is two Ray actors whose training replica is sharded with
FSDP2 over the cell's two ranks (gloo, ``cpu`` mesh), the world has 4 ranks with fsdp.py's
groups. Checked: the run completes with sane losses and moved, finite weights; every cell is
two processes that stay the same while cells switch roles; and the run's first optimizer step,
retrained by one local process on the run's own traces and rewards, lands on the weights the
sharded core checkpointed (test_runtime's check, there with one rank per cell).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from test_runtime import (
    ADAM_WELL_CONDITIONED,
    B,
    _adam_scale,
    _args,
    _gyre,
    _jsonl,
    _step_groups,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 6


@pytest.fixture(scope="module")
def done(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gyre-multirank")
    extra = ("policy.cells=2", "run.cell.devices=2")
    r = _gyre(_args(tiny_model_dir, out, "g2", STEPS, *extra), out / "g2.log")
    assert r.returncode == 0, r.stdout[-6000:]
    rd = out / "g2"
    return {
        "dir": rd,
        "model": Path(tiny_model_dir),
        "summary": json.loads((rd / "summary.json").read_text()),
        "metrics": _jsonl(rd / "metrics.jsonl"),
        "executions": _jsonl(rd / "executions.jsonl"),
    }


def test_completes_with_sane_steps(done):
    import torch
    from safetensors.torch import load_file

    m = done["metrics"]
    assert [x["step"] for x in m] == list(range(STEPS))
    assert all(x["train/cell_ranks"] == 2 for x in m)
    assert all(math.isfinite(x["actor/loss"]) and math.isfinite(x["actor/grad_norm"]) for x in m)
    assert any(x["actor/grad_norm"] > 0 for x in m)
    final = load_file(str(done["dir"] / "checkpoints" / f"step-{STEPS}" / "model.safetensors"))
    start = load_file(str(done["model"] / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in final.values())
    assert max(float((final[k] - start[k]).abs().max()) for k in final) > 1e-3
    # each core rank wrote its optimizer shard beside the weights
    assert (done["dir"] / "checkpoints" / f"step-{STEPS}" / "optimizer-rank1.pt").exists()


def test_every_cell_is_two_processes_kept_across_switches(done):
    cells = json.loads((done["dir"] / "cells.json").read_text())
    pids = [c["rank_pids"] for c in cells if "cell" in c]
    assert len(pids) == 2 and all(len(p) == 2 for p in pids)
    assert len({p for ps in pids for p in ps}) == 4
    logs = done["dir"] / "logs"
    switches = [
        json.loads(x) for x in (logs / "cell-1.jsonl").read_text().splitlines() if '"switch"' in x
    ]
    # cell 1 went into training and its second rank computed there, in the process it started in
    assert any(s["to"] == "training" for s in switches), switches
    rank1 = [json.loads(x) for x in (logs / "cell-1-rank1.jsonl").read_text().splitlines()]
    assert not [r for r in rank1 if r.get("event") == "switch"]  # the leader's record only


def _whole_optimizer(ck: Path, out: Path) -> None:
    """The core's optimizer state of checkpoint ``ck`` made whole: FSDP2 shards every tensor
    along dim 0 in rank order, so rank 0's and rank 1's local tensors concatenate."""
    import torch

    a = torch.load(ck / "optimizer.pt", weights_only=True)
    b = torch.load(ck / "optimizer-rank1.pt", weights_only=True)
    for i, st in a["state"].items():
        for name, t in st.items():
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                st[name] = torch.cat([t, b["state"][i][name]])
    torch.save(a, out / "optimizer.pt")


def _retrain(done, tmp_path, s: int):
    """Step ``s`` retrained by one local core (one process, whole replica) from the run's own
    traces and rewards, from the checkpoint before it (its optimizer shards made whole)."""
    import torch

    from gyre.config import load_config
    from gyre.train.demo.coordinator import LocalCoordinator
    from gyre.train.demo.core import Core

    torch.set_num_threads(1)
    rd = done["dir"]
    cfg = load_config(rd / "config.toml")
    root = tmp_path / f"ck{s}"
    if s:
        src = rd / "checkpoints" / f"step-{s}"
        shutil.copytree(src, root / f"step-{s}")
        _whole_optimizer(src, root / f"step-{s}")
        (root / "latest").write_text(f"step-{s}")
    ck = {"dir": str(root) if s else None, "every_steps": 10**6}
    tc = cfg.trainer.model_copy(update={"checkpoint": cfg.trainer.checkpoint.model_copy(update=ck)})
    core = Core(tc, LocalCoordinator())
    core.start(resume=bool(s))
    assert core.state.step == s
    m = done["metrics"][s]
    assert core.add_groups(_step_groups(rd, cfg, m, done["executions"], s)) == B
    res = core.run_step()
    mine = {k: v.detach().clone() for k, v in core.model.state_dict().items()}
    scale = _adam_scale(core)
    core.stop()
    return res, mine, scale


@pytest.mark.parametrize("which", ["first", "two_cells"])
def test_step_matches_one_process(done, tmp_path, which):
    """The run's first step, and its first step over both cells (the prefix reduce per shard
    position, the sharded optimizer, the broadcast of new shards), each retrained by one
    process land on the sharded core's next checkpoint (float32 tolerance, as test_runtime)."""

    ms = done["metrics"]
    if which == "first":
        s = 0
    else:
        both = [x["step"] for x in ms if x["train/participants"] == 2 and x["actor/grad_norm"]]
        assert both, "no step of the run had both cells (cell 1 never joined in time)"
        s = both[0]
    assert ms[s]["batch/executions_trained"], f"step {s} carried no signal"
    _same_step(done, tmp_path, s)


def _same_step(done, tmp_path, s: int) -> None:
    import torch
    from safetensors.torch import load_file

    m = done["metrics"][s]
    res, mine, scale = _retrain(done, tmp_path, s)
    assert res.metrics["batch/executions_scored"] == m["batch/executions_scored"]
    assert res.metrics["train/tokens"] == m["train/tokens"]
    # the gradient is ranks' and cells' float32 partial sums added (reduce-scatter, prefix
    # reduce), another order than one process's: measured 1.1e-5 relative on the norm
    assert res.metrics["actor/grad_norm"] == pytest.approx(m["actor/grad_norm"], rel=5e-5)
    assert res.metrics["actor/loss"] == pytest.approx(m["actor/loss"], rel=1e-4, abs=1e-6)
    after = load_file(str(done["dir"] / "checkpoints" / f"step-{s + 1}" / "model.safetensors"))
    diff = 0.0
    for k in after:
        d = (after[k] - mine[k]).abs()
        ok = (
            scale[k] >= ADAM_WELL_CONDITIONED
            if k in scale
            else torch.ones_like(d, dtype=torch.bool)
        )
        diff = max(diff, float(d[ok].max()) if ok.any() else 0.0)
    assert diff <= 1e-5, (s, diff)  # measured 1.2e-6 at step 0 (lr 3e-3)


@pytest.mark.extended  # the sharded checkpoint is checked against a local retrain above
def test_resume_loads_the_sharded_optimizer(done, tmp_path):
    """A copy of the run resumed for 2 more steps: each core rank loads its optimizer shard
    back, so the first resumed step, retrained by one process from that checkpoint with the
    shards made whole, lands on the resumed run's next checkpoint. Resuming with another G is
    refused with one line."""
    import subprocess
    import sys

    rd = tmp_path / "g2"
    shutil.copytree(done["dir"], rd)
    base = [sys.executable, "-m", "gyre.cli", "run", "--resume", str(rd), "--log-format", "plain"]
    base += ["--set", f"policy.total_steps={STEPS + 2}"]
    other = subprocess.run(
        [*base, "--set", "run.cell.devices=1"], capture_output=True, text=True, timeout=300
    )
    assert other.returncode != 0
    assert "run.cell.devices=2" in other.stderr.strip().splitlines()[-1], other.stderr[-2000:]
    r = _gyre(base, tmp_path / "resume.log")
    assert r.returncode == 0, r.stdout[-6000:]
    resumed = {**done, "dir": rd, "metrics": _jsonl(rd / "metrics.jsonl")}
    resumed["executions"] = _jsonl(rd / "executions.jsonl")
    assert [x["step"] for x in resumed["metrics"]] == list(range(STEPS + 2))
    m = resumed["metrics"][STEPS]
    if not m["batch/executions_trained"]:
        pytest.skip("the first resumed step carried no signal")
    _same_step(resumed, tmp_path, STEPS)


def test_a_lost_satellite_of_two_ranks_restarts_the_run_from_its_checkpoint(
    tiny_model_dir, tmp_path
):
    """The nemesis SIGKILLs a training satellite's leader. A multi-rank cell cannot join a
    rebuilt world (ranks.py), so its loss restarts the run from the last checkpoint, as the
    core's does: the run completes every step once, on cells of two new processes each."""
    extra = ("policy.cells=2", "run.cell.devices=2", "run.chaos.kills=1", "run.chaos.seed=0")
    extra += ('run.chaos.kinds=["satellite"]', "run.chaos.window_s=[1.0, 3.0]")
    extra += ("trainer.checkpoint.every_steps=2",)
    r = _gyre(_args(tiny_model_dir, tmp_path, "g2-chaos", 8, *extra), tmp_path / "g2-chaos.log")
    assert r.returncode == 0, r.stdout[-6000:]
    rd = tmp_path / "g2-chaos"
    s = json.loads((rd / "summary.json").read_text())
    (kill,) = s["chaos"]
    assert "skipped" not in kill and kill.get("handled"), kill
    (f,) = [f for f in s["faults"] if f.get("core_restart")]
    assert f["cell"] == kill["target"]["cell"] == 1 and f["core_restart"] == 1, f
    m = _jsonl(rd / "metrics.jsonl")
    assert [x["step"] for x in m] == list(range(8))  # none lost, none applied twice
    trained = [g for x in m for g in x["groups"]]
    assert len(trained) == len(set(trained))
    placed = json.loads((rd / "cells.json").read_text())
    assert all(len(set(c["rank_pids"])) == 2 for c in placed if "cell" in c)
    assert kill["target"]["pid"] not in {p for c in placed if "cell" in c for p in c["rank_pids"]}
