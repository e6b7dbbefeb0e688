"""The pure parts of ``bench_vs_trl.py``: Gyre's config mapped onto TRL's, and the comparison.

Nothing here imports TRL or torch, so the unit tests (tests/unit/test_bench_vs_trl.py) run
in CI without the ``.venv-trl`` venv. :func:`trl_args` is the single place where a Gyre
setting becomes a ``GRPOConfig`` field: the test checks each value against the Gyre config
it came from, so the two sides cannot drift apart silently.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

# The placements and the (phi, mu) pair that holds the mean staleness E[d] at 1.5
# (bench_placements.py's pairs). TRL is on-policy: E[d] = 0.
PAIRS = {"colocate": (0.0, 4), "async": (1.5, 1), "elastic": (0.5, 3)}
PRECISIONS = ("fp32", "bf16")


class MappingError(ValueError):
    """A Gyre setting that TRL's GRPOTrainer cannot reproduce."""


def harness_flag(args: list[str], flag: str) -> str | None:
    """The value after ``flag`` in the harness's argument list (the last one wins, as in
    argparse); None when absent."""
    value = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def sampling(cfg: Any) -> dict[str, float | int]:
    """What Gyre's policy samples with: the reference agent sends ``max_tokens`` (and a
    temperature only when given ``--temperature``); everything else is the engine's default
    (``gyre.engine.protocol.SamplingParams``: temperature 1, top_p 1, top_k -1, min_p 0)."""
    from gyre.engine.protocol import SamplingParams

    args = list(cfg.run.harness_args)
    d = SamplingParams()
    max_tokens = harness_flag(args, "--max-tokens")
    temp = harness_flag(args, "--temperature")
    if max_tokens is None:
        from gyre.harness.reference_agent import AgentConfig

        max_tokens = str(AgentConfig.max_tokens)
    return {
        "max_tokens": int(max_tokens),
        "temperature": float(temp) if temp is not None else d.temperature,
        "top_p": d.top_p,
        "top_k": d.top_k,
        "min_p": d.min_p,
    }


def trl_args(
    cfg: Any,
    *,
    steps: int,
    seed: int,
    precision: str,
    micro_batch: int,
    output_dir: str,
) -> dict[str, Any]:
    """``GRPOConfig`` keyword arguments that reproduce the Gyre run ``cfg`` (a GyreConfig).

    One optimizer step = B prompts x N completions, generated once and trained once
    (``num_iterations=1``); the AdamW settings, gradient clip, lr (constant, no warm-up)
    and the sequence-level clip band are Gyre's; GSPO's sequence ratio; no KL term (Gyre has
    none); per-sequence length normalisation (``loss_type="grpo"``, as Gyre's 1/|T_e|)."""
    if precision not in PRECISIONS:
        raise MappingError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    p, t = cfg.policy, cfg.trainer
    opt, obj = t.optim, t.objective
    if opt.name != "adamw":
        raise MappingError(f"trainer.optim.name={opt.name!r}: the comparison maps AdamW only")
    hargs = list(cfg.run.harness_args)
    if harness_flag(hargs, "--max-turns") != "1" or "--no-tools" not in hargs:
        raise MappingError(
            "TRL's side trains one reply per prompt: the Gyre run needs the reference agent with "
            "--max-turns 1 --no-tools"
        )
    per_step = p.group_size * p.batch_groups
    if micro_batch < 1 or per_step % micro_batch:
        raise MappingError(
            f"micro batch {micro_batch} must divide the {per_step} completions of a step "
            f"(N={p.group_size} x B={p.batch_groups})"
        )
    s = sampling(cfg)
    return {
        "output_dir": output_dir,
        "seed": seed,
        "max_steps": steps,
        "num_generations": p.group_size,
        "per_device_train_batch_size": micro_batch,
        "gradient_accumulation_steps": per_step // micro_batch,
        "num_iterations": 1,
        "max_completion_length": s["max_tokens"],
        "temperature": s["temperature"],
        "top_p": s["top_p"],
        "top_k": 0 if s["top_k"] in (-1, 0) else s["top_k"],  # TRL's "no top-k" is 0
        "min_p": s["min_p"] or None,
        "repetition_penalty": 1.0,
        "optim": "adamw_torch",
        "learning_rate": opt.lr,
        "adam_beta1": opt.betas[0],
        "adam_beta2": opt.betas[1],
        "adam_epsilon": opt.eps,
        "weight_decay": opt.weight_decay,
        "max_grad_norm": opt.grad_clip if opt.grad_clip is not None else 0.0,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        "beta": 0.0,
        "loss_type": "grpo",
        "importance_sampling_level": "sequence",
        "epsilon": round(1.0 - obj.clip_low, 12),
        "epsilon_high": round(obj.clip_high - 1.0, 12),
        "scale_rewards": "group",
        "use_cpu": t.device == "cpu",
        "bf16": precision == "bf16",
        "fp16": False,
        "gradient_checkpointing": False,  # TRL's default is True; Gyre recomputes nothing
        "shuffle_dataset": False,  # the dataset is already in Gyre's task order
        "remove_unused_columns": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "dataloader_num_workers": 0,
        "disable_tqdm": True,
    }


def gyre_overrides(
    *,
    steps: int,
    seed: int,
    precision: str,
    placement: str,
    out_dir: str,
    name: str,
    taskset: str,
    model_dir: str | None,
    pair: tuple[float, int] | None = None,
) -> list[str]:
    """``--set`` overrides of the Gyre side (the example's own values for everything else).

    ``pair`` is (phi, mu); None takes the placement's pair at staleness 1.5 (``PAIRS``).
    (0, 1) is on-policy: every group is trained by the version that sampled it, as TRL's."""
    if placement not in PAIRS:
        raise MappingError(f"placement must be one of {list(PAIRS)}, not {placement!r}")
    phi, mu = PAIRS[placement] if pair is None else pair
    sets = [
        f"seed={seed}",
        f"policy.total_steps={steps}",
        f"policy.placement={placement}",
        f"policy.phi={phi}",
        f"policy.mu={mu}",
        f"run.taskset={taskset}",
        f"run.out_dir={out_dir}",
        f"run.name={name}",
        "run.log_format=plain",
    ]
    if model_dir:
        sets.append(f"model_dir={model_dir}")
    if precision == "bf16":
        sets += ["trainer.compute_dtype=bfloat16", "engine.compute_dtype=bfloat16"]
    return sets


def eval_versions(steps: int, every: int, mu: int) -> list[int]:
    """The policy versions Gyre evaluates: 0, each publication (every ``mu`` steps) that
    crossed a multiple of ``every``, and the final one (``gyre.runtime.executions``)."""
    out, last = [0], 0
    for v in range(mu, steps + 1, mu):
        if every and v // every > last // every:
            out.append(v)
            last = v
    if every and steps not in out:
        out.append(steps)
    return out


# ---------------------------------------------------------------------- the comparison
METRICS = ("accuracy", "reward_mean")  # held-out pass rate (reward 1), held-out mean reward


def first_reach(
    evals: list[dict[str, Any]], target: float, key: str = "accuracy"
) -> dict[str, Any] | None:
    """The first evaluation (in step order) whose ``key`` is at least ``target``."""
    for e in sorted(evals, key=lambda e: e["step"]):
        if e.get(key) is not None and e[key] >= target - 1e-12:
            return e
    return None


def final_eval(side: dict[str, Any], key: str = "accuracy") -> dict[str, Any] | None:
    ev = [e for e in side.get("evals", []) if e.get(key) is not None]
    return max(ev, key=lambda e: e["step"]) if ev else None


def time_to_target(
    gyre: dict[str, Any], trl: dict[str, Any], key: str = "accuracy"
) -> dict[str, Any]:
    """Gyre's wall-clock to TRL's final held-out ``key`` (accuracy or mean reward), as a ratio
    to TRL's wall-clock to it (the time TRL's final evaluation's weights existed: its whole
    training run). Also the same ratio when TRL is timed to its own *first* reach of it."""
    fin = final_eval(trl, key)
    if fin is None:
        return {"target": None, "ratio": None, "why": "TRL has no held-out evaluation"}
    target = fin[key]
    g = first_reach(gyre.get("evals", []), target, key)
    t_first = first_reach(trl["evals"], target, key)
    out: dict[str, Any] = {
        "target": target,
        "trl_time_s": fin["time"],
        "trl_first_time_s": t_first["time"] if t_first else None,
        "gyre_time_s": g["time"] if g else None,
        "gyre_step": g["step"] if g else None,
        "ratio": None,
        "ratio_first": None,
        "why": "",
    }
    if g is None:
        out["why"] = f"Gyre never reached {target:.3f} in {gyre.get('steps')} steps"
    elif fin["time"] <= 0 or (t_first is not None and t_first["step"] == 0):
        out["why"] = "TRL did not improve on its starting accuracy"
    else:
        out["ratio"] = g["time"] / fin["time"]
        if t_first and t_first["time"] > 0:
            out["ratio_first"] = g["time"] / t_first["time"]
    return out


def _mean_sd(xs: list[float]) -> tuple[float | None, float | None]:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _fmt(x: float | None, digits: int = 2, sd: float | None = None) -> str:
    if x is None:
        return "-"
    s = f"{x:.{digits}f}"
    return s + (f" ± {sd:.{digits}f}" if sd else "")


ROWS = [  # (label, key in a side's summary, digits)
    ("held-out accuracy, start", "acc_start", 3),
    ("held-out accuracy, end", "acc_end", 3),
    ("held-out mean reward, start", "reward_start", 3),
    ("held-out mean reward, end", "reward_end", 3),
    ("training wall-clock, s", "wall_s", 1),
    ("time per step, s", "step_s", 2),
    ("tokens/s (prompt + completion)", "tokens_per_s", 1),
    ("completion tokens/s", "completion_tokens_per_s", 1),
    ("peak memory, RSS sum of the process tree, MB", "peak_rss_mb", 0),
    ("peak memory, PSS sum of the process tree, MB", "peak_pss_mb", 0),
    ("start-up (process start to first step), s", "startup_s", 1),
    ("mean staleness (policy versions)", "staleness_mean", 2),
]


def side_summary(side: dict[str, Any]) -> dict[str, Any]:
    """The per-run figures a table row reads, from one side's normalised result."""
    ev = sorted(
        [e for e in side.get("evals", []) if e["accuracy"] is not None], key=lambda e: e["step"]
    )
    wall = side.get("wall_s") or 0.0
    tok = (side.get("prompt_tokens") or 0) + (side.get("completion_tokens") or 0)
    return {
        "acc_start": ev[0]["accuracy"] if ev and ev[0]["step"] == 0 else None,
        "acc_end": ev[-1]["accuracy"] if ev else None,
        "reward_start": ev[0].get("reward_mean") if ev and ev[0]["step"] == 0 else None,
        "reward_end": ev[-1].get("reward_mean") if ev else None,
        "wall_s": wall or None,
        "step_s": wall / side["steps"] if wall and side.get("steps") else None,
        "tokens_per_s": tok / wall if wall else None,
        "completion_tokens_per_s": (side.get("completion_tokens") or 0) / wall if wall else None,
        "peak_rss_mb": side.get("peak_rss_mb"),
        "peak_pss_mb": side.get("peak_pss_mb"),
        "startup_s": side.get("startup_s"),
        "staleness_mean": side.get("staleness_mean"),
    }


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """All runs (both sides, all seeds) -> per-side means and per-seed time-to-target ratios."""
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in runs:
        by.setdefault(r["side"], {})[r["seed"]] = r
    summ = {side: {seed: side_summary(r) for seed, r in rs.items()} for side, rs in by.items()}
    agg = {
        side: {k: _mean_sd([s[k] for s in per.values()]) for _, k, _ in ROWS}
        for side, per in summ.items()
    }
    both = sorted(set(by.get("gyre", {})) & set(by.get("trl", {})))
    out: dict[str, Any] = {"per_seed": summ, "mean_sd": agg}
    for key, suffix in zip(METRICS, ("", "_reward"), strict=True):
        ratios = {seed: time_to_target(by["gyre"][seed], by["trl"][seed], key) for seed in both}
        vals = [r["ratio"] for r in ratios.values() if r["ratio"] is not None]
        out[f"time_to_target{suffix}"] = ratios
        out[f"ratio_mean{suffix}"] = statistics.fmean(vals) if vals else None
        out[f"ratio_seeds{suffix}"] = len(vals)
    return out


def _ratio_table(result: dict[str, Any], suffix: str, what: str) -> list[str]:
    """Per seed: TRL's final held-out ``what``, Gyre's wall-clock to it, and the ratio."""
    ratios = result.get(f"time_to_target{suffix}") or {}
    if not ratios:
        return []
    out = [
        f"| seed | TRL final {what} | TRL s | Gyre s to it (step) | ratio | "
        "ratio to TRL's first reach |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for seed, r in ratios.items():
        g = "-" if r["gyre_time_s"] is None else f"{r['gyre_time_s']:.1f} ({r['gyre_step']})"
        ratio = _fmt(r["ratio"]) if r["ratio"] is not None else f"- ({r['why']})"
        out.append(
            f"| {seed} | {_fmt(r['target'], 3)} | {_fmt(r.get('trl_time_s'), 1)} | {g} | "
            f"{ratio} | {_fmt(r.get('ratio_first'))} |"
        )
    mean = result.get(f"ratio_mean{suffix}")
    if mean is not None:
        n = result[f"ratio_seeds{suffix}"]
        out.append(f"\nmean ratio ({what}) over {n} seed(s): {mean:.2f}")
    return [*out, ""]


def markdown(result: dict[str, Any], notes: list[str]) -> str:
    """The table (mean ± sd over seeds), the per-seed ratios, then the notes."""
    agg = result["mean_sd"]
    sides = [s for s in ("gyre", "trl") if s in agg]
    lines = ["| | " + " | ".join({"gyre": "Gyre", "trl": "TRL"}[s] for s in sides) + " |"]
    lines.append("| --- |" + " --- |" * len(sides))
    for label, key, digits in ROWS:
        cells = [_fmt(agg[s][key][0], digits, agg[s][key][1]) for s in sides]
        if all(c == "-" for c in cells):
            continue
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    out = ["\n".join(lines), ""]
    for suffix, what in (("", "accuracy"), ("_reward", "mean reward")):
        out += _ratio_table(result, suffix, what)
    out += [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"
