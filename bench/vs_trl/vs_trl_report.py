"""The comparison's outputs: vs_trl.md (table and notes), vs_trl.json, vs_trl.png."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from vs_trl_lib import compare, markdown

NOTES = [
    "Matched: model directory, prompts (the user message alone, rendered by the model's chat "
    "template with its default system prompt; checked token for token below), reward (the "
    "family's score), N, B, completion length, sampling (temperature 1, top_p 1, no top-k), "
    "AdamW (lr, betas, eps, weight decay), grad clip, constant lr, steps, seed, precision, "
    "task order (Gyre's task stream), held-out problems and the versions evaluated.",
    "Wall-clock starts when training starts (Gyre: cells up; TRL: on_train_begin) and ends at "
    "the last optimizer step; start-up is reported apart. Evaluations before the last step "
    "count on both sides: TRL's pause its training, Gyre's run beside it on the same engines. "
    "The final evaluation counts on neither. TRL's time without evaluations is in vs_trl.json.",
    "Staleness: TRL is on-policy (its sequence ratio is exactly 1, so its clip never acts). "
    "Gyre runs at the (phi, mu) in the title: at (0, 1) it is on-policy too, its ratio off 1 "
    "only by the engine/trainer mismatch; at E[d] 1.5 (the placements' pairs) it trains on "
    "groups 1-2 versions old; its ratio reference is below.",
    "Differs: advantages: Gyre (R - mean) / (population std + 1e-6), TRL (R - mean) / (sample "
    "std + 1e-4): a constant factor sqrt(N/(N-1)) = 1.07 for N = 8, which AdamW's normalisation "
    "absorbs (the grad clip then acts at a 7 % different norm).",
    "Differs: TRL generates the 32 completions of a step in one static batch with HF generate "
    "in the training process; Gyre samples in its engines (continuous batching, max_batch 16 "
    "per engine) behind the proxy, one harness process per execution (the reference agent) "
    "and a verifier process per score. TRL has no proxy or harness process: their cost is "
    "under 'Gyre's harness and proxy'.",
    "Differs: a step whose groups all have equal rewards has no gradient. Gyre then skips "
    "optimizer.step() (its version still advances); TRL calls AdamW's step with zero gradients, "
    "which still moves the weights along the momentum (m decays by beta1 per such step).",
    "Priority: both sides run at the caller's nice; Gyre's Ray workers too "
    "(RAY_worker_niceness=0: Ray's default of 15 would let any other load on the machine "
    "slow Gyre's cells before TRL's process).",
    "Memory: the peak over the run of the summed RSS (and PSS, which counts shared pages once) "
    "of the whole process tree, sampled every 0.5 s: TRL's one process; Gyre's driver (with "
    "the proxy thread), Ray's processes and cells, harness and verifier processes.",
]


RATIO_REFERENCE = {
    "behaviour": "Gyre's ratio reference: the engine's behaviour log-prob, token weights capped "
    "at 5, the sequence clip against it (the paper's reading).",
    "proximal": "Gyre's ratio reference: the proximal policy (the step's starting weights): "
    "r = s = 1, no staleness correction.",
    "decoupled": "Gyre's ratio reference: decoupled: token weights against the engine's "
    "behaviour log-prob (capped at 5), the sequence clip against the proximal policy, so it "
    "never binds (docs/training.md, 'The objective').",
}


def notes(ratio_reference: str) -> list[str]:
    """NOTES with the line that says which ratio reference Gyre's run used."""
    return [*NOTES, RATIO_REFERENCE[ratio_reference]]


def _side(runs: list[dict[str, Any]], side: str) -> list[dict[str, Any]]:
    return [r for r in runs if r["side"] == side]


def extra_lines(runs: list[dict[str, Any]], checks: list[dict[str, Any]]) -> list[str]:
    """Figures beside the table: the harness and proxy cost, CPU by kind, prompt checks."""
    out = []
    for c in checks:
        out.append(
            f"Prompt check, seed {c['seed']}: {c['identical']} of {c['compared']} first-step "
            "prompts identical token for token (TRL's rendering vs Gyre's trace)."
        )
    for g in _side(runs, "gyre"):
        h = g.get("harness") or {}
        if h.get("executions"):
            out.append(
                f"Gyre's harness and proxy, seed {g['seed']}: per training execution, median "
                f"{h['overhead_s_median']:.2f} s (p95 {h['overhead_s_p95']:.2f} s, "
                f"{100 * h['overhead_share_median']:.0f} % of the execution) beyond the model "
                f"call's {h['call_s_median']:.2f} s at the proxy (harness launch, agent start-up, "
                f"scoring; {h['executions']} executions). The proxy's own cost per call is "
                "2.3-2.7 ms (docs/proxy.md)."
            )
        t = g.get("tree", {})
        out.append(
            f"Gyre CPU seconds by kind, seed {g['seed']}: {t.get('cpu_s_by_kind')}; "
            f"peak PSS by kind (MB): {t.get('peak_pss_by_kind_mb')}"
        )
    for t in _side(runs, "trl"):
        out.append(
            f"TRL seed {t['seed']}: generation {t['generation_s']:.1f} s of "
            f"{t['wall_without_eval_s']:.1f} s training without evaluations "
            f"({t['eval_s']:.1f} s of evaluations); CPU {t['tree'].get('cpu_s')} s; "
            f"torch threads {t.get('threads')}."
        )
    return out


def plot(runs: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 2, figsize=(11, 7.5))
    colors = {"gyre": "tab:blue", "trl": "tab:orange"}
    styles = ["-", "--", ":", "-."]
    for row, (key, name) in zip(
        grid,
        (("accuracy", "held-out accuracy"), ("reward_mean", "held-out mean reward")),
        strict=True,
    ):
        for side, label in (("gyre", "Gyre"), ("trl", "TRL")):
            rs = _side(runs, side)
            for i, r in enumerate(rs):
                ev = [
                    e for e in sorted(r["evals"], key=lambda e: e["step"]) if e.get(key) is not None
                ]
                kw = {
                    "color": colors[side],
                    "alpha": 0.85,
                    "marker": "o",
                    "ms": 3,
                    "ls": styles[i % 4],
                }
                lab = f"{label} seed {r['seed']}" if len(rs) > 1 else label
                row[0].plot([e["step"] for e in ev], [e[key] for e in ev], label=lab, **kw)
                row[1].plot([e["time"] for e in ev], [e[key] for e in ev], label=lab, **kw)
        row[0].set(xlabel="optimizer step (policy version)", ylabel=name)
        row[1].set(xlabel="wall-clock since training began, s", ylabel=name)
    top = max(
        [e.get(k) or 0 for r in runs for e in r["evals"] for k in ("accuracy", "reward_mean")]
        + [0.05]
    )
    for ax in grid.flat:
        ax.set_ylim(-0.01, min(1.02, 1.15 * top))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, runs, checks, a, notes: list[str]) -> str:
    result = compare(runs)
    staleness = [
        r["staleness_mean"] for r in _side(runs, "gyre") if r.get("staleness_mean") is not None
    ]
    head = (
        f"# Gyre vs TRL: {a.family}, {a.steps} steps, seeds {a.seeds}, {a.held_out} held-out, "
        f"{a.precision}"
        + (f", Gyre {a.gyre_placement}" if _side(runs, "gyre") else "")
        + (f" (phi, mu) = ({a.pair[0]:g}, {a.pair[1]})" if _side(runs, "gyre") else "")
        + (f" (mean staleness {statistics.fmean(staleness):.2f})" if staleness else "")
        + f", model {a.model}\n\n"
    )
    md = head + markdown(result, [*notes, *extra_lines(runs, checks)])
    (out / "vs_trl.md").write_text(md)
    (out / "vs_trl.json").write_text(
        json.dumps(
            {
                "args": {k: str(v) for k, v in vars(a).items()},
                "comparison": result,
                "runs": runs,
                "prompt_checks": checks,
            },
            indent=1,
            default=str,
        )
    )
    plot(runs, out / "vs_trl.png", head.strip("# \n"))
    return md
