"""One core in one process: normalisation, pre-pass vs local s_e, streaming, missing, checkpoints."""

import copy
import json

import pytest

from gyre.trace.assessment import Missing, MissingReason
from gyre.train.buffer import PackingBuffer, ReadyGroup, pack_groups
from gyre.train.checkpoint import latest_checkpoint
from gyre.train.config import (
    CheckpointConfig,
    ObjectiveConfig,
    OptimConfig,
    StreamConfig,
    TrainerConfig,
)
from gyre.train.demo.coordinator import LocalCoordinator
from gyre.train.demo.core import Core
from gyre.train.demo.synthetic import synthetic_groups
from gyre.train.replica import load_causal_lm


@pytest.fixture(scope="module")
def base_groups(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), "float64")
    return synthetic_groups(
        model, 4, 3, seed=1, context_len=(6, 12), target_len=(6, 12), noise=0.002
    )


def cfg_for(model_dir, **kw) -> TrainerConfig:
    """float64 weights and plain SGD: the update is linear in the gradient, so "moves the weights as
    much" is measured directly (Adam's first step is ~lr*sign(g) and would hide a scale error)."""
    stream = kw.pop("stream", StreamConfig(batch_groups=2, token_budget=64, stall_timeout_s=20))
    optim = kw.pop("optim", OptimConfig(name="sgd", lr=1.0, grad_clip=None))
    return TrainerConfig(
        model_dir=str(model_dir), dtype="float64", optim=optim, stream=stream, **kw
    )


INIT = {}


def moved(tiny_model_dir, p):
    if not INIT:
        INIT.update(
            {
                n: q.detach()
                for n, q in load_causal_lm(str(tiny_model_dir), "float64").named_parameters()
            }
        )
    return max_diff(p, INIT)


# HF Qwen3 runs RMSNorm in float32 even with float64 weights, so grouping the same targets into rows
# differently changes gradients at float32 rounding (~3e-8 relative): compare relative to the step.
TOL = 1e-5


def step_params(cfg, groups, *, steps=1, source_mode="all", resume=False):
    core = Core(cfg, LocalCoordinator(stall_timeout_s=20))
    core.start(resume=resume)
    results = []
    pending = [copy.deepcopy(g) for g in groups]
    if source_mode == "all":
        core.add_groups(pending)
        src = None
    else:

        def src():
            return [pending.pop(0)] if pending else []

    for _ in range(steps):
        results.append(core.run_step(source=src))
    params = {n: p.detach().clone() for n, p in core.model.named_parameters()}
    core.stop()
    return params, results


def max_diff(a, b):
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def branched(group: ReadyGroup, eid: str, n: int, *, naive: bool = False) -> ReadyGroup:
    """Execution ``eid`` as ``n`` copies of its row: targets dealt round-robin (admission-style,
    disjoint T_e) or, with ``naive``, every copy keeps every target with weight 1/(n|T|)."""
    g = copy.deepcopy(group)
    (row,) = g.rows[eid]
    tpos = [i for i, t in enumerate(row.is_target) if t]
    rows = []
    for k in range(n):
        r = copy.deepcopy(row)
        keep = set(tpos) if naive else set(tpos[k::n])
        r.is_target = [i in keep for i in range(len(r.is_target))]
        w = 1.0 / (n * len(tpos)) if naive else 1.0 / len(tpos)
        r.token_weight = [w if i in keep else 0.0 for i in range(len(r.is_target))]
        r.execution_index = [0 if i in keep else -1 for i in range(len(r.is_target))]
        r.policy_version = [
            row.policy_version[i] if i in keep else -1 for i in range(len(r.is_target))
        ]
        rows.append(r)
    g.rows[eid] = rows
    return g


def test_five_branches_move_weights_like_one(tiny_model_dir, base_groups):
    cfg = cfg_for(tiny_model_dir, stream=StreamConfig(batch_groups=2, token_budget=4096))
    groups = base_groups[:2]
    one, r1 = step_params(cfg, groups)
    five, r5 = step_params(cfg, [branched(groups[0], "g0/e1", 5)] + groups[1:])
    naive, _ = step_params(cfg, [branched(groups[0], "g0/e1", 5, naive=True)] + groups[1:])
    m = moved(tiny_model_dir, one)
    assert m > 1e-3  # the step did move the weights
    assert max_diff(one, five) < TOL * m
    assert max_diff(one, naive) < TOL * m
    assert (
        r5[0].metrics["train/tokens"] > 3 * r1[0].metrics["train/tokens"] / 2
    )  # 5 rows really were trained
    # without 1/|T_e| (every branch weighted as its own execution) the update would differ
    flat = [branched(groups[0], "g0/e1", 5, naive=True)] + groups[1:]
    for r in flat[0].rows["g0/e1"]:
        r.token_weight = [5 * w for w in r.token_weight]
    with pytest.raises(ValueError, match="weights sum to 4.99"):
        step_params(cfg, flat)  # refused when the group enters the buffer


def test_split_execution_prepass_matches_local_and_forbid_refuses(tiny_model_dir, base_groups):
    groups = [branched(base_groups[0], "g0/e1", 5)] + base_groups[1:2]
    big = cfg_for(tiny_model_dir, stream=StreamConfig(batch_groups=2, token_budget=4096))
    small = cfg_for(tiny_model_dir, stream=StreamConfig(batch_groups=2, token_budget=48))
    whole, rw = step_params(big, groups)
    split, rs = step_params(small, groups)
    assert rw[0].metrics["batch/executions_split"] == 0
    assert rs[0].metrics["batch/executions_split"] >= 1 and rs[0].metrics["train/micro_steps"] > 2
    assert max_diff(whole, split) < TOL * moved(tiny_model_dir, whole)
    forbid = cfg_for(
        tiny_model_dir,
        stream=StreamConfig(batch_groups=2, token_budget=48),
        objective=ObjectiveConfig(execution_split="forbid"),
    )
    with pytest.raises(ValueError, match="span several micro-steps"):
        step_params(forbid, groups)


def test_streaming_equals_one_packed_batch(tiny_model_dir, base_groups):
    cfg = cfg_for(tiny_model_dir, stream=StreamConfig(batch_groups=4, token_budget=64))
    a, ra = step_params(cfg, base_groups, source_mode="all")
    b, rb = step_params(cfg, base_groups, source_mode="one_per_pump")
    assert max_diff(a, b) < TOL * moved(tiny_model_dir, a)
    assert ra[0].metrics["actor/loss"] == pytest.approx(rb[0].metrics["actor/loss"], rel=1e-12)


def test_missing_is_not_zero_in_the_update(tiny_model_dir, base_groups):
    cfg = cfg_for(tiny_model_dir)
    g0, g1 = base_groups[:2]
    miss = copy.deepcopy(g0)
    miss.rewards["g0/e2"] = Missing(
        reason=MissingReason.evaluator_error, detail="evaluator crashed"
    )
    gone = copy.deepcopy(g0)
    del gone.rewards["g0/e2"], gone.rows["g0/e2"]
    zero = copy.deepcopy(g0)
    zero.rewards["g0/e2"] = 0.0
    p_miss, r_miss = step_params(cfg, [miss, g1])
    p_gone, _ = step_params(cfg, [gone, g1])
    p_zero, r_zero = step_params(cfg, [zero, g1])
    m = moved(tiny_model_dir, p_miss)
    assert max_diff(p_miss, p_gone) < TOL * m  # missing == the execution never existed
    assert max_diff(p_miss, p_zero) > 0.05 * m  # counting it as zero is a different update
    assert r_miss[0].metrics["batch/executions_missing"] == 1
    assert (
        r_miss[0].metrics["batch/executions_scored"] == 5
        and r_zero[0].metrics["batch/executions_scored"] == 6
    )


def test_all_equal_group_gives_no_gradient_but_counts(tiny_model_dir, base_groups):
    cfg = cfg_for(tiny_model_dir)
    eq = copy.deepcopy(base_groups[0])
    eq.rewards = {e: 1.0 for e in eq.rewards}
    p, r = step_params(cfg, [eq, base_groups[1]])
    m = r[0].metrics
    assert m["batch/groups_all_equal"] == 1 and m["batch/executions_scored"] == 6
    # no gradient from eq: the same update as group 1 alone, scaled by E=6 instead of 3 (SGD is linear)
    alone = cfg_for(
        tiny_model_dir,
        stream=StreamConfig(batch_groups=1, token_budget=64),
        optim=OptimConfig(name="sgd", lr=0.5, grad_clip=None),
    )
    p_alone, _ = step_params(alone, [base_groups[1]])
    assert max_diff(p, p_alone) < TOL * moved(tiny_model_dir, p)


def test_checkpoint_resume_is_exact_and_hf_loadable(tiny_model_dir, base_groups, tmp_path):
    from transformers import AutoModelForCausalLM

    ck = CheckpointConfig(dir=str(tmp_path / "ck"))
    adam = OptimConfig(lr=1e-3)  # optimizer state must survive the checkpoint
    straight, _ = step_params(cfg_for(tiny_model_dir, optim=adam), base_groups, steps=2)
    cfg = cfg_for(tiny_model_dir, checkpoint=ck, optim=adam)
    _, r = step_params(cfg, base_groups, steps=1)
    last = latest_checkpoint(ck.dir)
    state = json.loads((last / "trainer_state.json").read_text())
    assert (
        state["step"] == 1 and state["policy_version"] == 1 and len(state["consumed_groups"]) == 2
    )
    assert state["consumed_groups"] == r[0].seal.meta["groups"]
    hf = AutoModelForCausalLM.from_pretrained(last)  # plain HF loading of the core's checkpoint
    assert (last / "tokenizer.json").exists() and hf.config.model_type == "qwen3"
    # resume: the consumed groups are offered again and must be ignored by the data cursor
    resumed, r2 = step_params(cfg, base_groups, steps=1, resume=True)
    assert set(r2[0].seal.meta["groups"]).isdisjoint(state["consumed_groups"])
    assert max_diff(straight, resumed) < 1e-12


def test_buffer_oldest_version_first_and_cursor():
    mk = lambda gid, v: ReadyGroup(gid, {"x": 1.0}, {}, policy_version=v)  # noqa: E731
    buf = PackingBuffer(consumed={"old"})
    assert not buf.add(mk("old", 0))
    for gid, v in [("a", 3), ("b", 1), ("c", 2), ("d", 1)]:
        assert buf.add(mk(gid, v))
    assert not buf.add(mk("a", 3))  # already queued
    assert [g.group_id for g in buf.take(3)] == ["b", "d", "c"]
    assert [g.group_id for g in buf.take(3)] == ["a"]


def test_pack_groups_rejects_bad_input(base_groups):
    g = copy.deepcopy(base_groups[0])
    g.rows["stranger"] = g.rows["g0/e0"]
    with pytest.raises(ValueError, match="without a reward"):
        pack_groups([g], 0, StreamConfig(), ObjectiveConfig())
    with pytest.raises(ValueError, match="without a reward"):
        PackingBuffer().add(g)
    g = copy.deepcopy(base_groups[0])
    with pytest.raises(ValueError, match="appears twice"):
        pack_groups([g, copy.deepcopy(g)], 0, StreamConfig(), ObjectiveConfig())


def test_bad_group_is_refused_alone_and_loses_nothing(tiny_model_dir, base_groups):
    buf = PackingBuffer()
    good = copy.deepcopy(base_groups[0])
    assert buf.add(good)
    bad = copy.deepcopy(base_groups[1])
    bad.rewards["g1/e0"] = float("nan")
    with pytest.raises(ValueError, match="not finite"):
        buf.add(bad)
    bad = copy.deepcopy(base_groups[1])
    bad.rows["g1/e0"][0].parent[3] = 7  # a parent after the token
    with pytest.raises(ValueError, match="g1/e0"):
        buf.add(bad)
    assert len(buf) == 1 and buf.take(5)[0].group_id == "g0"


def test_batch_without_signal_consumes_groups_without_an_update(tiny_model_dir, base_groups):
    eq = [copy.deepcopy(g) for g in base_groups[:2]]
    for g in eq:
        g.rewards = {e: 0.0 for e in g.rewards}
    p, r = step_params(cfg_for(tiny_model_dir), eq)
    assert moved(tiny_model_dir, p) == 0.0  # no optimizer step
    # the version advances all the same: versions and steps stay one count (gyre.train.step)
    assert r[0].policy_version == 1 and r[0].metrics["batch/groups_all_equal"] == 2
    assert r[0].metrics["actor/grad_norm"] == 0.0 and r[0].metrics["actor/target_tokens"] == 0
    assert r[0].seal.meta["groups"] == ["g0", "g1"] and r[0].seal.n_items == 0


def test_clear_errors_for_an_unfillable_batch_and_bad_config(tiny_model_dir, base_groups):
    from pydantic import ValidationError

    core = Core(cfg_for(tiny_model_dir, stream=StreamConfig(batch_groups=3)), LocalCoordinator())
    core.start(resume=False)
    core.add_groups([copy.deepcopy(base_groups[0])])
    with pytest.raises(ValueError, match="needs 3 ready groups and 1"):
        core.run_step()
    assert len(core.buffer) == 1 and core.policy_version == 0  # nothing lost, nothing changed
    core.stop()
    with pytest.raises(ValidationError, match="must contain 1.0"):
        ObjectiveConfig(clip_low=1.01)


def test_a_failed_step_gives_its_groups_back(tiny_model_dir, base_groups):
    groups = [branched(base_groups[0], "g0/e1", 5)] + [copy.deepcopy(base_groups[1])]
    forbid = cfg_for(
        tiny_model_dir,
        stream=StreamConfig(batch_groups=2, token_budget=48),
        objective=ObjectiveConfig(execution_split="forbid"),
    )
    core = Core(forbid, LocalCoordinator())
    core.start(resume=False)
    core.add_groups(groups)
    with pytest.raises(ValueError, match="span several micro-steps"):
        core.run_step()
    assert len(core.buffer) == 2 and core.state.consumed_groups == [] and core.policy_version == 0
    core.cfg = cfg_for(tiny_model_dir, stream=StreamConfig(batch_groups=2, token_budget=48))
    core.worker.cfg = core.cfg  # the same core retries the step with the pre-pass allowed
    res = core.run_step()
    assert res.policy_version == 1 and sorted(res.seal.meta["groups"]) == ["g0", "g1"]
    core.stop()


def test_staleness_metrics(tiny_model_dir, base_groups):
    gs = [copy.deepcopy(g) for g in base_groups[:2]]
    gs[0].policy_version, gs[1].policy_version = (
        -3,
        -1,
    )  # sampled 3 and 1 versions before the core's version 0
    _, r = step_params(cfg_for(tiny_model_dir), gs)
    assert (
        r[0].metrics["batch/staleness_mean"] == 2.0 and r[0].metrics["batch/staleness_max"] == 3.0
    )
