"""Trace files written by the trace store -> a ready group -> one training step."""

from gyre.trace.assessment import Missing, MissingReason
from gyre.trace.store import TraceWriter, trace_path
from gyre.trace.synthetic import small_execution
from gyre.train.config import ObjectiveConfig, OptimConfig, StreamConfig, TrainerConfig
from gyre.train.demo.coordinator import LocalCoordinator
from gyre.train.demo.core import Core
from gyre.train.groups import group_from_traces
from gyre.train.replica import load_causal_lm


def test_trace_files_to_a_training_step(tiny_model_dir, tmp_path):
    vocab = load_causal_lm(str(tiny_model_dir)).config.vocab_size
    w = TraceWriter(tmp_path / "traces", fsync=False)
    eids = [f"q1/e{k}" for k in range(4)]
    for k, eid in enumerate(eids[:3]):
        for rec in small_execution(eid, seed=k, vocab=vocab):
            w.append(rec)
    w.close()
    with open(trace_path(tmp_path / "traces", eids[1]), "a") as f:
        f.write('{"truncated": ')  # a proxy that died mid-write
    traces = {e: trace_path(tmp_path / "traces", e) for e in eids}  # e3 never wrote a trace
    rewards = {
        eids[0]: 1.0,
        eids[1]: 0.0,
        eids[2]: Missing(reason=MissingReason.evaluator_error),
        eids[3]: 0.5,
    }
    group, report = group_from_traces("q1", traces, rewards, vocab_size=vocab, j_max=4, seed=3)
    assert set(group.admissions) == {eids[0], eids[1]}
    # the harness's Missing crosses into the group as is (reason kept); no trace -> missing too
    assert group.rewards[eids[2]] == rewards[eids[2]]
    e3 = group.rewards[eids[3]]
    assert isinstance(e3, Missing) and e3.reason is MissingReason.trace_unreadable
    assert eids[3] in report.unreadable and len(report.trace_errors[eids[1]]) == 1
    again, _ = group_from_traces("q1", traces, rewards, vocab_size=vocab, j_max=4, seed=3)
    assert [p.leaf for p in again.admissions[eids[0]].paths] == [
        p.leaf for p in group.admissions[eids[0]].paths
    ]

    cfg = TrainerConfig(
        model_dir=str(tiny_model_dir),
        optim=OptimConfig(name="sgd", lr=1.0, grad_clip=None),
        objective=ObjectiveConfig(ratio_reference="proximal"),
        stream=StreamConfig(batch_groups=1, token_budget=4096, pack_mode="tree"),
    )
    core = Core(cfg, LocalCoordinator(stall_timeout_s=30))
    core.start(resume=False)
    core.add_groups([group])
    res = core.run_step()
    assert res.policy_version == 1 and res.metrics["batch/executions_scored"] == 2
    assert res.metrics["batch/executions_missing"] == 2 and res.metrics["actor/target_tokens"] > 0
    core.stop()


def test_a_group_without_every_reward_is_not_ready(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="not ready: no reward for \\['e1'\\]"):
        group_from_traces(
            "q", {"e0": tmp_path / "a", "e1": tmp_path / "b"}, {"e0": 1.0}, j_max=5, seed=0
        )
