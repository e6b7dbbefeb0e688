"""A ``gyre run`` cell's training state: tasks fetched once per group, the one optimizer step."""

import copy

import pytest
import torch

from gyre.train.buffer import pack_groups
from gyre.train.checkpoint import latest_checkpoint, load_state
from gyre.train.config import CheckpointConfig, OptimConfig, StreamConfig, TrainerConfig
from gyre.train.demo.synthetic import synthetic_groups
from gyre.train.replica import load_causal_lm
from gyre.train.stats import ObjectiveStats
from gyre.train.trainer import CellTrainer


@pytest.fixture(scope="module")
def groups(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), "float64")
    return synthetic_groups(model, 2, 3, seed=3, context_len=(6, 10), target_len=(6, 10))


def _core(tiny_model_dir, tmp_path, every: int = 1) -> CellTrainer:
    cfg = TrainerConfig(
        model_dir=str(tiny_model_dir),
        dtype="float64",
        optim=OptimConfig(name="sgd", lr=0.5, grad_clip=None),
        stream=StreamConfig(token_budget=24),
        checkpoint=CheckpointConfig(every_steps=every, keep=1),
    )
    core = CellTrainer(0, cfg)
    core.load(0, str(tmp_path / "snapshots"))
    return core


def _weights(core: CellTrainer) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in core.replica().live_model.named_parameters()}


def test_a_groups_tasks_are_fetched_once_per_step(tiny_model_dir, tmp_path, groups):
    core = _core(tiny_model_dir, tmp_path)
    tasks = pack_groups([groups[0]], 0, core.cfg.stream, core.cfg.objective).tasks
    assert len(tasks) >= 3  # enough micro-steps to claim in parts
    fetched = []

    def fetch():
        fetched.append(1)
        return copy.deepcopy(tasks)

    idx = [t.index for t in tasks]
    snap = str(tmp_path / "snapshots")
    parts = [core.compute(0, 0, 5, idx[i::3], snap, fetch) for i in range(3)]
    assert len(fetched) == 1  # three claims of the group, one fetch
    total = ObjectiveStats()
    for p in parts:
        total.add(p)
    targets = sum(sum(s.is_target) for t in tasks for s in t.micro_step.sequences)
    assert total.tokens == targets > 0  # every task computed once, whoever's share it was in
    with pytest.raises(RuntimeError, match="core holds version 0, step 1 needs 1"):
        core.compute(1, 1, 5, idx[:1], snap, fetch)
    core.compute(1, 0, 5, idx[:1], snap, fetch)  # a new step: its tasks are fetched anew
    assert len(fetched) == 2


def test_the_step_advances_the_version_with_or_without_signal(tiny_model_dir, tmp_path, groups):
    core = _core(tiny_model_dir, tmp_path, every=2)
    snap, ck = str(tmp_path / "snapshots"), str(tmp_path / "checkpoints")
    before = _weights(core)
    # no signal: nothing computed, E = 0. No optimizer step, but version and step advance
    m = core.finish_step(None, 1, ObjectiveStats(), 0, ["g0"], snap, ck, total_steps=3)
    assert (core.version, core.state.step, core.state.policy_version) == (1, 1, 1)
    assert m["actor/grad_norm"] == 0.0 and m["actor/target_tokens"] == 0.0
    assert all(torch.equal(before[n], w) for n, w in _weights(core).items())
    assert latest_checkpoint(ck) is None and "timing/checkpoint" not in m  # every_steps = 2
    # a step with signal at version 1 moves the weights; step 2 is due: checkpointed
    tasks = pack_groups([groups[1]], 0, core.cfg.stream, core.cfg.objective).tasks
    stats = core.compute(2, 1, 0, [t.index for t in tasks], snap, lambda: tasks)
    m = core.finish_step(None, 1, stats, 3, ["g1"], snap, ck, total_steps=3)
    assert core.version == 2 and m["actor/grad_norm"] > 0 and "timing/checkpoint" in m
    assert any(not torch.equal(before[n], w) for n, w in _weights(core).items())
    state = load_state(latest_checkpoint(ck))
    assert (state.step, state.policy_version, state.consumed_groups) == (2, 2, ["g0", "g1"])
    # the run's last step (total_steps = 3) is always checkpointed; keep = 1 keeps only it
    core.finish_step(None, 1, ObjectiveStats(), 0, [], snap, ck, total_steps=3)
    assert latest_checkpoint(ck).name == "step-3"
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-3"]


def test_a_satellite_holds_no_optimizer(tiny_model_dir, tmp_path):
    core = _core(tiny_model_dir, tmp_path)
    sat = CellTrainer(1, core.cfg)
    sat.load(0, str(tmp_path / "snapshots"))  # pulls the core's snapshot of version 0
    assert sat.version == 0
    with pytest.raises(RuntimeError, match="holds no optimizer"):
        sat.finish_step(None, 1, ObjectiveStats(), 0, [], str(tmp_path / "s"), None, None)
    sat.drop()
    with pytest.raises(RuntimeError, match="has no training replica"):
        sat.replica()
