"""bench/vs_trl/bench_vs_trl.py's pure parts: Gyre's config mapped onto TRL's GRPOConfig, and the
comparison (time to TRL's final accuracy, the table). No TRL needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "vs_trl"))

from vs_trl_lib import (  # noqa: E402
    MappingError,
    compare,
    eval_versions,
    gyre_overrides,
    harness_flag,
    markdown,
    time_to_target,
    trl_args,
)

from gyre.config import load_config  # noqa: E402

EXAMPLE = ROOT / "examples" / "smollm2-arith.toml"


def cfg(*sets: str):
    return load_config(EXAMPLE, list(sets))


def args(c, **kw):
    base = {"steps": 21, "seed": 3, "precision": "fp32", "micro_batch": 16, "output_dir": "o"}
    return trl_args(c, **{**base, **kw})


def test_trl_args_are_the_gyre_configs_values():
    c = cfg()
    a = args(c)
    o, obj, p = c.trainer.optim, c.trainer.objective, c.policy
    assert a["num_generations"] == p.group_size == 8
    assert a["per_device_train_batch_size"] * a["gradient_accumulation_steps"] == 32
    assert a["per_device_train_batch_size"] * a["gradient_accumulation_steps"] == (
        p.group_size * p.batch_groups
    )
    assert a["max_completion_length"] == int(harness_flag(c.run.harness_args, "--max-tokens"))
    assert a["max_completion_length"] == 64
    assert (a["learning_rate"], a["adam_beta1"], a["adam_beta2"]) == (o.lr, *o.betas)
    assert (a["adam_epsilon"], a["weight_decay"], a["max_grad_norm"]) == (
        o.eps,
        o.weight_decay,
        o.grad_clip,
    )
    assert a["epsilon"] == pytest.approx(1 - obj.clip_low) and a["epsilon"] == pytest.approx(0.005)
    assert a["epsilon_high"] == pytest.approx(obj.clip_high - 1)
    assert (a["temperature"], a["top_p"], a["top_k"], a["min_p"]) == (1.0, 1.0, 0, None)
    assert a["importance_sampling_level"] == "sequence" and a["loss_type"] == "grpo"
    assert (a["beta"], a["num_iterations"], a["lr_scheduler_type"], a["warmup_steps"]) == (
        0.0,
        1,
        "constant",
        0,
    )
    assert (a["max_steps"], a["seed"], a["use_cpu"], a["bf16"]) == (21, 3, True, False)
    assert a["gradient_checkpointing"] is False and a["shuffle_dataset"] is False


def test_trl_args_follow_overrides():
    c = cfg(
        "trainer.optim.lr=1e-6",
        "policy.group_size=4",
        "policy.batch_groups=2",
        "trainer.optim.grad_clip=null",
        'run.harness_args=["--max-turns","1","--no-tools","--max-tokens","32","--temperature","0.7"]',
    )
    a = args(c, micro_batch=4, precision="bf16")
    assert a["learning_rate"] == 1e-6 and a["num_generations"] == 4
    assert a["gradient_accumulation_steps"] == 2  # 8 completions, 4 per forward
    assert (a["max_completion_length"], a["temperature"]) == (32, 0.7)
    assert a["max_grad_norm"] == 0.0  # HF: no clipping
    assert a["bf16"] is True


def test_trl_args_refuse_what_trl_cannot_match():
    with pytest.raises(MappingError, match="divide"):
        args(cfg(), micro_batch=5)
    with pytest.raises(MappingError, match="AdamW"):
        args(cfg("trainer.optim.name=sgd"))
    with pytest.raises(MappingError, match="max-turns 1"):
        args(cfg('run.harness_args=["--max-turns","4","--no-tools"]'))
    with pytest.raises(MappingError, match="precision"):
        args(cfg(), precision="fp8")


def test_gyre_overrides_load_and_keep_the_staleness_pair():
    sets = gyre_overrides(
        steps=6, seed=2, precision="fp32", placement="colocate", out_dir="/tmp/x",
        name="g", taskset="t", model_dir="m",
    )  # fmt: skip
    c = cfg(*sets)
    assert (c.seed, c.policy.total_steps, c.policy.placement.value) == (2, 6, "colocate")
    assert (c.policy.phi, c.policy.mu) == (0.0, 4)
    assert c.trainer.seed == 2 and c.model_dir == "m" and c.run.taskset == "t"
    bf = gyre_overrides(
        steps=6, seed=2, precision="bf16", placement="elastic", out_dir="o", name="g",
        taskset="t", model_dir=None,
    )  # fmt: skip
    assert "trainer.compute_dtype=bfloat16" in bf and "engine.compute_dtype=bfloat16" in bf
    on = gyre_overrides(
        steps=6, seed=2, precision="fp32", placement="elastic", out_dir="o", name="g",
        taskset="t", model_dir=None, pair=(0.0, 1),
    )  # fmt: skip
    c = cfg(*on)  # on-policy elastic: E[d] = 0
    assert (c.policy.placement.value, c.policy.phi, c.policy.mu) == ("elastic", 0.0, 1)
    assert c.policy.expected_staleness == 0.0


def test_eval_versions_follow_publications():
    assert eval_versions(21, 6, 3) == [0, 6, 12, 18, 21]
    assert eval_versions(21, 5, 3) == [0, 6, 12, 15, 21]
    assert eval_versions(3, 6, 3) == [0, 3]
    assert eval_versions(4, 0, 1) == [0]


def side(name, seed, evals, wall, steps=21, **kw):
    ev = [{"step": s, "time": t, "accuracy": a, "reward_mean": a} for s, t, a in evals]
    return {"side": name, "seed": seed, "steps": steps, "wall_s": wall, "evals": ev, **kw}


def test_time_to_target_ratio():
    trl = side("trl", 0, [(0, 0, 0.1), (6, 40, 0.3), (12, 80, 0.5), (21, 140, 0.45)], 140)
    gyre = side("gyre", 0, [(0, 0, 0.1), (6, 20, 0.2), (12, 35, 0.46), (21, 60, 0.6)], 60)
    r = time_to_target(gyre, trl)
    assert r["target"] == 0.45 and r["gyre_time_s"] == 35 and r["gyre_step"] == 12
    assert r["ratio"] == pytest.approx(35 / 140)
    assert r["ratio_first"] == pytest.approx(35 / 80)  # TRL first reached 0.45 at step 12
    slow = side("gyre", 0, [(0, 0, 0.1), (21, 300, 0.4)], 300)
    r2 = time_to_target(slow, trl)
    assert r2["ratio"] is None and "never reached" in r2["why"]
    flat = side("trl", 0, [(0, 0, 0.2), (12, 80, 0.1), (21, 140, 0.2)], 140)
    r3 = time_to_target(gyre, flat)  # TRL ended where it started: nothing to race to
    assert r3["ratio"] is None and "did not improve" in r3["why"]


def test_compare_and_table():
    runs = [
        side("gyre", 0, [(0, 0, 0.1), (21, 50, 0.5)], 50, prompt_tokens=900, completion_tokens=100,
             peak_pss_mb=3000.0, staleness_mean=1.5),
        side("gyre", 1, [(0, 0, 0.1), (21, 70, 0.3)], 70, prompt_tokens=900, completion_tokens=100),
        side("trl", 0, [(0, 0, 0.1), (21, 100, 0.4)], 100, prompt_tokens=900, completion_tokens=100,
             peak_pss_mb=1000.0, staleness_mean=0.0),
        side("trl", 1, [(0, 0, 0.1), (21, 100, 0.4)], 100, prompt_tokens=900, completion_tokens=100),
    ]  # fmt: skip
    res = compare(runs)
    assert res["mean_sd"]["gyre"]["wall_s"][0] == pytest.approx(60)
    assert res["mean_sd"]["gyre"]["step_s"][0] == pytest.approx(60 / 21)
    assert res["mean_sd"]["trl"]["tokens_per_s"][0] == pytest.approx(10.0)
    assert res["time_to_target"][0]["ratio"] == pytest.approx(0.5)
    assert res["time_to_target"][1]["ratio"] is None  # 0.3 never reaches 0.4
    assert res["ratio_mean"] == pytest.approx(0.5) and res["ratio_seeds"] == 1
    md = markdown(res, ["a note"])
    assert "| held-out accuracy, end | 0.400 ± 0.141 | 0.400 |" in md
    assert "| 0 | 0.400 | 100.0 | 50.0 (21) | 0.50 |" in md
    assert md.rstrip().endswith("- a note")


def test_reward_target_is_raced_apart_from_accuracy():
    """Accuracy (reward 1) can stay flat while the mean reward moves: each gets its own race."""

    def ev(rows):
        return [{"step": s, "time": t, "accuracy": a, "reward_mean": r} for s, t, a, r in rows]

    trl = {
        "side": "trl",
        "seed": 0,
        "steps": 21,
        "wall_s": 100,
        "evals": ev([(0, 0, 0.0, 0.02), (21, 100, 0.0, 0.12)]),
    }
    gyre = {
        "side": "gyre",
        "seed": 0,
        "steps": 21,
        "wall_s": 60,
        "evals": ev([(0, 0, 0.0, 0.01), (6, 15, 0.0, 0.08), (12, 30, 0.0, 0.15)]),
    }
    res = compare([gyre, trl])  # fmt: skip
    assert res["time_to_target"][0]["ratio"] is None  # TRL's accuracy never moved
    assert res["time_to_target_reward"][0]["ratio"] == pytest.approx(0.3)
    assert res["mean_sd"]["gyre"]["reward_end"][0] == pytest.approx(0.15)
    md = markdown(res, [])
    assert "| 0 | 0.120 | 100.0 | 30.0 (12) | 0.30 |" in md
    assert "mean ratio (mean reward) over 1 seed(s): 0.30" in md


@pytest.mark.parametrize(
    ("pair", "says"),
    [
        (["x", "1"], "takes a number and a whole number"),
        (["0", "0"], "policy.mu: Input should be greater than or equal to 1"),
        (["0.5", "1", "--gyre-placement", "colocate"], "phi must be 0"),
    ],
)
def test_a_bad_staleness_pair_is_one_line_before_anything_runs(tmp_path, pair, says):
    import subprocess

    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "vs_trl" / "bench_vs_trl.py"), "--gyre-staleness", *pair,
         "--skip-trl", "--out", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
