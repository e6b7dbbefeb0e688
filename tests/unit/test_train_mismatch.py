"""Train/inference mismatch metrics: zero when the engine and the trainer agree, right on a
constructed example, reduced with sums and maxes, and measured by the replica's own forward."""

import math

import pytest
import torch

from gyre.train.buffer import pack_groups
from gyre.train.config import StreamConfig, TrainerConfig
from gyre.train.demo.synthetic import synthetic_groups
from gyre.train.objective import mismatch_stats
from gyre.train.packed import token_logprobs
from gyre.train.replica import ReplicaWorker, load_causal_lm
from gyre.train.stats import N_SUM, ObjectiveStats


def test_zero_when_behaviour_equals_trainer():
    lp = torch.tensor([-0.3, -2.0, -0.01, -5.0])
    s = mismatch_stats(lp, lp.clone().double(), torch.tensor([3, 3, 2, -1]), 3)
    m = s.mismatch_metrics()
    assert m["mismatch/tokens_same_version"] == 2 and m["mismatch/tokens_other_version"] == 1
    for c in ("same", "other"):
        assert m[f"mismatch/kl_{c}_version"] == 0.0
        assert m[f"mismatch/max_abs_{c}_version"] == 0.0
        assert m[f"mismatch/token_mult_prob_error_{c}_version"] == 1.0


def test_constructed_example():
    # d = l - b: same-version targets get d = +0.2, -0.5; other-version d = 0.1; the last has no
    # behaviour record (version -1) and is left out even though its d is huge
    b = torch.tensor([-1.0, -1.0, -2.0, -3.0], dtype=torch.float64)
    lp = b + torch.tensor([0.2, -0.5, 0.1, 9.0], dtype=torch.float64)
    ver = torch.tensor([7, 7, 6, -1])
    m = mismatch_stats(lp, b, ver, 7).mismatch_metrics()
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    assert m["mismatch/tokens_same_version"] == 2
    assert m["mismatch/kl_same_version"] == pytest.approx((k3(0.2) + k3(-0.5)) / 2, rel=1e-12)
    assert m["mismatch/max_abs_same_version"] == pytest.approx(0.5, rel=1e-12)
    assert m["mismatch/token_mult_prob_error_same_version"] == pytest.approx(
        (math.exp(0.2) + math.exp(0.5)) / 2, rel=1e-12
    )
    assert m["mismatch/tokens_other_version"] == 1
    assert m["mismatch/kl_other_version"] == pytest.approx(k3(0.1), rel=1e-12)
    assert m["mismatch/max_abs_other_version"] == pytest.approx(0.1, rel=1e-12)
    # the trainer's version unknown: nothing is same-version
    u = mismatch_stats(lp, b, ver, None).mismatch_metrics()
    assert u["mismatch/tokens_same_version"] == 0 and "mismatch/kl_same_version" not in u
    assert u["mismatch/tokens_other_version"] == 3


def test_same_version_mismatch_per_model_call_bucket():
    """Each same-version target counts once, in the bucket of the call that sampled it (1, 2,
    3-4, 5-8, ..., 33+); other-version, unrecorded and call-unknown targets count in none."""
    k3 = lambda d: math.exp(d) - d - 1  # noqa: E731
    b = torch.zeros(8, dtype=torch.float64)
    d = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], dtype=torch.float64)
    ver = torch.tensor([4, 4, 4, 4, 4, 3, -1, 4])
    turn = torch.tensor([1, 3, 4, 5, 40, 2, 2, -1])
    m = mismatch_stats(b + d, b, ver, 4, turn).mismatch_metrics()
    per = {
        k[len("mismatch/tokens_same_version_turn") :]: v
        for k, v in m.items()
        if "turn" in k and "tokens" in k
    }
    assert per == {"1": 1, "3-4": 2, "5-8": 1, "33+": 1}
    assert m["mismatch/kl_same_version_turn3-4"] == pytest.approx((k3(0.2) + k3(0.3)) / 2)
    assert m["mismatch/kl_same_version_turn33+"] == pytest.approx(k3(0.5))
    assert m["mismatch/tokens_same_version"] == 6  # the call-unknown one is same-version too
    # no turns given (a PackedSequence without them), or the trainer's version unknown: none
    for got in (mismatch_stats(b + d, b, ver, 4), mismatch_stats(b + d, b, ver, None, turn)):
        assert not any("turn" in k for k in got.mismatch_metrics())


def test_reduce_sums_counters_and_maxes_the_max():
    a = ObjectiveStats(tokens=3, mm_same_tokens=2, mm_same_k3=0.5, mm_same_max=0.4)
    b = ObjectiveStats(tokens=4, mm_same_tokens=1, mm_same_k3=0.25, mm_same_max=0.9)
    merged = ObjectiveStats.from_list(a.as_list())
    merged.add(ObjectiveStats.from_list(b.as_list()))
    assert merged.tokens == 7 and merged.mm_same_tokens == 3
    assert merged.mm_same_k3 == 0.75 and merged.mm_same_max == 0.9
    assert ObjectiveStats.from_list(a.as_list()) == a
    # the max fields are the tail a collective max-reduces
    assert a.as_list()[N_SUM:] == [0.4, 0.0]
    with pytest.raises(ValueError, match="stats values"):
        ObjectiveStats.from_list([0.0] * 5)  # a vector of another layout is refused, not misread


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_replica_measures_in_its_own_forward(tiny_model_dir, noise):
    """Behaviour log-probs = the trainer's own (+ known noise): the replica's mismatch is 0 (or
    exactly what the noise makes it), split by the synthetic groups' versions (g % 3)."""
    model = load_causal_lm(str(tiny_model_dir), "float64")
    groups = synthetic_groups(
        model, 3, 2, seed=2, context_len=(4, 8), target_len=(4, 8), noise=noise
    )
    cfg = TrainerConfig(
        model_dir=str(tiny_model_dir),
        dtype="float64",
        stream=StreamConfig(batch_groups=3, token_budget=64),
    )
    tasks = pack_groups(groups, 0, cfg.stream, cfg.objective).tasks
    worker = ReplicaWorker(cfg)
    worker.start()
    total = ObjectiveStats()
    by_index = {t.index: t for t in tasks}
    for t in tasks:
        total.add(worker.compute(t, get_task=by_index.__getitem__, version=1))
    # the expected values, from the rows themselves
    want = {True: [], False: []}
    for t in tasks:
        for seq in t.micro_step.sequences:
            lp = token_logprobs(model, seq).detach()
            for i, tg in enumerate(seq.is_target):
                if tg and seq.policy_version[i] >= 0:
                    d = float(lp[i]) - seq.behaviour_logprob[i]
                    want[seq.policy_version[i] == 1].append(d)
    m = total.mismatch_metrics()
    assert want[True] and want[False]  # both classes are present
    assert m["mismatch/tokens_same_version"] == len(want[True])
    assert m["mismatch/tokens_other_version"] == len(want[False])
    for c, ds in (("same", want[True]), ("other", want[False])):
        mx = max(abs(d) for d in ds)
        assert m[f"mismatch/max_abs_{c}_version"] == pytest.approx(mx, abs=1e-12)
        if noise == 0.0:
            assert m[f"mismatch/max_abs_{c}_version"] < 1e-12
            assert m[f"mismatch/kl_{c}_version"] < 1e-20
        else:
            assert m[f"mismatch/max_abs_{c}_version"] > 0.01
            assert m[f"mismatch/token_mult_prob_error_{c}_version"] == pytest.approx(
                sum(math.exp(abs(d)) for d in ds) / len(ds), rel=1e-10
            )
