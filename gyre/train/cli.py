"""`gyre train ...` commands: a local multi-cell demo and checkpoint inspection.

Heavy imports (torch, transformers) stay inside the commands.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import typer

from gyre.cli_errors import fail, first_line

app = typer.Typer(
    help="Trainer: local elastic cells on synthetic groups, checkpoints.", no_args_is_help=True
)


@app.command("demo")
def demo(
    cells: int = typer.Option(2, min=1, help="K cells as local processes (cell 0 = core)."),
    steps: int = typer.Option(2, min=1, help="Optimizer steps."),
    groups: int = typer.Option(4, min=1, help="B: groups per step."),
    group_size: int = typer.Option(4, min=1, help="N: executions per group."),
    budget: int = typer.Option(64, min=1, help="Token budget per micro-step."),
    join_after: int = typer.Option(
        1, min=0, help="Satellite k joins after k*JOIN_AFTER micro-steps are done."
    ),
    model_dir: Path | None = typer.Option(
        None, help="HF causal LM dir (default: build the tiny model)."
    ),
    out: Path | None = typer.Option(None, help="Output dir (default: a temp dir)."),
    checkpoint_dir: Path | None = typer.Option(None, help="Write/resume checkpoints here."),
) -> None:
    """Train on synthetic groups with K local cells; satellites join each step late, in order."""
    from pydantic import ValidationError

    from gyre.cli_errors import fail, make_dir, require_model_dir, user_errors
    from gyre.train.config import CheckpointConfig, StreamConfig, TrainerConfig
    from gyre.train.demo.local import (
        JoinPlan,
        LocalRun,
        SyntheticData,
        read_participation,
        run_local,
    )
    from gyre.train.demo.participation import describe, summary
    from gyre.validation import validation_line

    with user_errors("train demo"):
        if model_dir is not None:
            require_model_dir(model_dir, "--model-dir")
        out = make_dir(out, "--out") if out else Path(tempfile.mkdtemp(prefix="gyre-train-demo-"))
        if checkpoint_dir is not None:
            make_dir(checkpoint_dir, "--checkpoint-dir")
    if model_dir is None:
        from gyre.models.tiny import build_tiny_model

        model_dir = build_tiny_model(out / "tiny-model")
    try:
        cfg = TrainerConfig(
            model_dir=str(model_dir),
            stream=StreamConfig(batch_groups=groups, token_budget=budget, stall_timeout_s=120),
            checkpoint=CheckpointConfig(dir=str(checkpoint_dir) if checkpoint_dir else None),
        )
    except ValidationError as e:
        fail("train demo", validation_line(e))
    run = LocalRun(
        name="demo",
        cfg=cfg,
        steps=steps,
        resume=checkpoint_dir is not None,
        data=SyntheticData(n_groups=groups * steps, group_size=group_size),
        joins={k: JoinPlan(after_done=k * join_after) for k in range(1, cells)},
    )
    run_local(cells, [run], out)
    # who joined each step, said out loud: the core never waits for a satellite, so under load a
    # step can run with fewer cells (same update); the reason comes from the cell itself
    steps_seen = read_participation(out / "demo", cells)
    rows = [json.loads(x) for x in (out / "demo" / "metrics.jsonl").read_text().splitlines()]
    for m, p in zip(rows, steps_seen):
        head, *missed = describe(p).split("\n")
        typer.echo(
            f"step {m['step']}: version {m['version']} {head} "
            f"claims {m['claims']} loss {m['actor/loss']:+.4f} grad_norm {m['actor/grad_norm']:.3f} "
            f"clipfrac {m['actor/pg_clipfrac']:.3f} tokens/s {m['train/tokens_per_s']:.0f}"
        )
        for line in missed:
            typer.echo(line)
    typer.echo(summary(steps_seen))
    typer.echo(f"weights: {out / 'demo' / 'final.safetensors'}")


@app.command("sft")
def sft(
    model_dir: Path = typer.Argument(..., help="HF model directory to start from."),
    demos: Path = typer.Argument(..., help="Conversations, JSON Lines (gyre harness demos)."),
    out_dir: Path = typer.Argument(..., help="Model directory to write."),
    steps: int = typer.Option(24, min=1, help="Optimizer steps."),
    batch_size: int = typer.Option(8, min=1, help="Conversations per step."),
    lr: float = typer.Option(2e-5, min=0.0, help="Peak learning rate (warm-up, then cosine)."),
    seed: int = typer.Option(0, help="Seed of the order and initialisation."),
) -> None:
    """A supervised warm-up on demonstrations, the assistant's tokens only (issue 34)."""
    from gyre.cli_errors import make_dir, require_model_dir, user_errors

    with user_errors("train sft"):
        require_model_dir(model_dir, "MODEL_DIR")
        make_dir(out_dir, "OUT_DIR")
    convs, tools = _read_demos(demos)
    from gyre.train.sft import SftSettings, train

    def progress(step: int, loss: float, lr_now: float) -> None:
        typer.echo(f"sft step {step + 1}/{steps}  loss {loss:.4f}  lr {lr_now:.2e}", err=True)

    settings = SftSettings(steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    try:
        res = train(model_dir, convs, out_dir, tools=tools, settings=settings, progress=progress)
    except ValueError as e:
        fail("train sft", first_line(e))
    typer.echo(
        f"{out_dir}: {res.demonstrations} demonstrations, {res.target_tokens} target tokens, "
        f"loss {res.losses[0]:.3f} -> {res.losses[-1]:.3f} in {res.seconds:.0f} s"
    )


def _read_demos(path: Path) -> tuple[list[list[dict]], list[dict] | None]:
    """The conversations of a demos file and their tools (one set: the file's first line's).
    A malformed line is one error line naming it, never a traceback."""
    if not path.is_file():
        fail("train sft", f"{path}: no such file; write one with `gyre harness demos`")
    convs: list[list[dict]] = []
    tools: list[dict] | None = None
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            msgs = row["messages"]
            if not isinstance(msgs, list) or not all(isinstance(m, dict) for m in msgs):
                raise TypeError("messages is not a list of objects")
        except (ValueError, KeyError, TypeError) as e:
            fail("train sft", f"{path}:{i}: not a conversation ({e})")
        convs.append(msgs)
        if tools is None:
            tools = row.get("tools")
    if not convs:
        fail("train sft", f"{path}: no conversations in it")
    return convs, tools


@app.command("checkpoint")
def checkpoint(
    root: Path = typer.Argument(..., help="Checkpoint root (holds 'latest' and step-N dirs)."),
) -> None:
    """Print the latest checkpoint's trainer state (step, policy version, data cursor)."""
    from gyre.cli_errors import fail

    if not root.is_dir():
        what = "not a directory" if root.exists() else "no such directory"
        fail("train checkpoint", f"{root}: {what}; give a checkpoint root", code=1)
    from gyre.train.checkpoint import latest_checkpoint, load_state

    ck = latest_checkpoint(root)
    if ck is None:
        fail("train checkpoint", f"no complete checkpoint under {root}", code=1)
    try:
        st = load_state(ck)
    except (OSError, ValueError, KeyError) as e:
        fail("train checkpoint", f"{ck}: unreadable trainer state ({e})", code=1)
    typer.echo(
        json.dumps(
            {
                "path": str(ck),
                "step": st.step,
                "policy_version": st.policy_version,
                "consumed_groups": len(st.consumed_groups),
                "model_source": st.model_source,
            }
        )
    )
