"""`gyre harness ...`: run one execution of one task, list task sets and profiles.

Keep heavy imports inside the commands (``gyre --help`` must stay fast).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from gyre.cli_errors import (
    error_line,
    fail,
    first_line,
    make_dir,
    require_http_url,
    user_errors,
)
from gyre.textsafe import printable

if TYPE_CHECKING:
    from .config import ExecutorConfig
    from .execution import ExecutionResult

app = typer.Typer(
    help="Run harnesses on tasks: debug a task or a harness profile before training.",
    no_args_is_help=True,
)


@app.command("run")
def run(
    task_dir: Path = typer.Argument(
        ..., help="Task folder (instruction.md, task.toml, environment/, tests/)."
    ),
    profile: str = typer.Option(
        "reference",
        "--profile",
        "-p",
        help="Harness profile: reference, mini-swe-agent, claude-code, synthetic, oracle, or a .toml file.",
    ),
    base_url: str = typer.Option(
        ...,
        "--base-url",
        help="OpenAI/Anthropic-compatible endpoint (e.g. the proxy): http://HOST:PORT, optionally ending in /v1.",
    ),
    api_key: str = typer.Option(
        "gyre-local", "--api-key", envvar="GYRE_API_KEY", help="Key the harness sends."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Model name the harness asks for (default: the profile's)."
    ),
    workspace_root: Path | None = typer.Option(
        None,
        "--workspace-root",
        help="Where execution folders go (default: $TMPDIR/gyre-executions).",
    ),
    execution_id: str | None = typer.Option(
        None, "--execution-id", help="Default: <task>-<random>."
    ),
    sandbox: bool = typer.Option(
        True,
        "--sandbox/--no-sandbox",
        help="Run the harness and the verifier under bubblewrap (the default; --no-sandbox "
        "runs them as you, with your files and network).",
    ),
    sandbox_network: str = typer.Option(
        "proxy-only",
        "--sandbox-network",
        help="proxy-only (own network namespace, only the base URL bridged in) or shared.",
    ),
    harness_timeout: float | None = typer.Option(
        None,
        "--harness-timeout",
        help="Seconds; overrides timeout_sec of the agent table in task.toml.",
    ),
    overall_timeout: float | None = typer.Option(
        None, "--overall-timeout", help="Seconds; overrides the task's overall budget."
    ),
    arg: list[str] = typer.Option(
        [], "--arg", help="Extra argument appended to the profile's command (repeatable)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the full result as JSON."),
) -> None:
    """Run one execution of one task and print its outcome (reward or missing, why, timings, workspace)."""
    import asyncio
    import uuid

    from .execution import ExecutionSpec
    from .executor import HarnessExecutor
    from .profiles import ProfileError, load_profile
    from .task import TaskError, load_task

    try:
        task = load_task(task_dir)
        prof = load_profile(profile)
    except (TaskError, ProfileError) as e:
        fail("harness run", printable(error_line(e)))
    except OSError as e:
        fail("harness run", printable(f"{e.filename or task_dir}: {e.strerror or e}"))
    with user_errors("harness run"):
        require_http_url(base_url, "--base-url")
        if workspace_root is not None:
            make_dir(workspace_root, "--workspace-root")
    if arg:
        prof = prof.model_copy(update={"args": [*prof.args, *arg]})
    cfg = _executor_config(sandbox, sandbox_network, workspace_root)
    for flag, v in (("--harness-timeout", harness_timeout), ("--overall-timeout", overall_timeout)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            fail("harness run", f"{flag} must be a finite number of seconds > 0, got {v}")
    spec = ExecutionSpec(
        execution_id=execution_id or f"{task.name}-{uuid.uuid4().hex[:8]}",
        task=task,
        profile=prof,
        base_url=base_url,
        api_key=api_key,
        model=model,
        harness_timeout_s=harness_timeout,
        overall_timeout_s=overall_timeout,
    )

    async def go():
        ex = HarnessExecutor(cfg)
        await ex.start()
        try:
            return await ex.run(spec)
        finally:
            await ex.stop()

    try:
        res = asyncio.run(go())
    except Exception as e:  # the executor could not run it at all (sandbox, workspace)
        fail("harness run", first_line(e))
    if as_json:
        typer.echo(res.model_dump_json(indent=2))
    else:
        _print_result(res)
    raise typer.Exit(0 if res.assessment.kind == "scored" else 1)


def _executor_config(
    sandbox: bool, sandbox_network: str, workspace_root: Path | None
) -> ExecutorConfig:
    from .config import ExecutorConfig, SandboxConfig

    if sandbox_network not in ("proxy-only", "shared"):
        fail(
            "harness run",
            f"--sandbox-network must be proxy-only or shared, got {sandbox_network!r}",
        )
    # checked just above; pydantic validates the CLI string into the Literal field
    cfg = ExecutorConfig(
        sandbox=SandboxConfig.model_validate({"enabled": sandbox, "network": sandbox_network})
    )
    if workspace_root is not None:
        cfg.workspace_root = workspace_root
    return cfg


def _print_result(res: ExecutionResult) -> None:
    """The outcome for a person: reward or missing and why, how the harness stopped, timings."""
    a = res.assessment
    if a.kind == "scored":
        extra = f" ({a.passed}/{a.total} tests)" if a.total is not None else ""
        typer.echo(f"reward     {a.reward:.4g}{extra}  [{a.rule}]")
        if a.detail.startswith("scored 0: ") or "none answered" in a.detail:
            typer.echo(f"detail     {a.detail}")  # why it is a zero, or the harness's report
    else:
        typer.echo(f"MISSING    {a.reason.value}: {a.detail}")
    h, t = res.harness, res.timings
    typer.echo(
        f"harness    {h.stop} (exit status {h.exit_code}){'  ' + h.error if h.error else ''}"
    )
    typer.echo(
        f"timings    setup {t.setup_s:.2f}s  harness {t.harness_s:.2f}s  scoring {t.scoring_s:.2f}s  total {t.total_s:.2f}s"
    )
    typer.echo(f"workspace  {res.workspace}")
    typer.echo(f"logs       {h.stdout_path}  {h.stderr_path}")


@app.command("tasks")
def tasks(
    taskset: str = typer.Argument("pyfix", help="Built-in task set name or a folder of tasks."),
) -> None:
    """List the tasks of a task set (and check that every one loads)."""
    from .task import TaskError, load_taskset

    try:
        loaded = load_taskset(taskset)
    except TaskError as e:  # one line per bad task: show the first, count the rest
        lines = [printable(ln.strip()) for ln in str(e).splitlines() if ln.strip()]
        more = f" (and {len(lines) - 2} more)" if len(lines) > 2 else ""
        fail("harness tasks", " ".join(lines[:2]) + more)
    except OSError as e:
        fail("harness tasks", printable(f"{e.filename or taskset}: {e.strerror or e}"))
    # Folder names are the task set's, printed as visible escapes: an OSC "set title" or a
    # cursor move in a name must not reach the terminal (gyre.textsafe).
    names = [printable(t.name) for t in loaded]
    width = max([len("task"), *(len(n) for n in names)])
    typer.echo(f"{'task':{width}s}  {'reward':8s}  {'harness timeout':>15s}  folder")
    for t, name in zip(loaded, names):
        typer.echo(
            f"{name:{width}s}  {t.reward_rule:8s}  {t.harness_timeout_s:>14.0f}s  "
            f"{printable(str(t.root))}"
        )


@app.command("generate")
def generate(
    family: str = typer.Argument(..., help="Task family: arith, countdown, calc or lookup."),
    out_dir: Path = typer.Argument(..., help="Task-set folder to write (created if missing)."),
    seed: int = typer.Option(0, help="Seed of the draw (the split does not depend on it)."),
    train: int = typer.Option(256, min=0, help="Training problems (folders train-*)."),
    held_out: int = typer.Option(64, "--held-out", min=0, help="Held-out problems (held-out-*)."),
) -> None:
    """Write a seeded task family as Harbor task folders, train and held-out splits disjoint."""
    from gyre.harness.families import problems
    from gyre.harness.families.write import write_taskset

    with user_errors("harness generate"):
        make_dir(out_dir, "OUT_DIR")
    try:
        items = problems(family, seed, "train", train) + problems(
            family, seed, "held-out", held_out
        )
        write_taskset(items, out_dir)
    except ValueError as e:
        fail("harness generate", first_line(e))
    except OSError as e:
        fail("harness generate", f"cannot write {out_dir}: {e.strerror or e}")
    typer.echo(f"{out_dir}: {train} train-* and {held_out} held-out-* {family} tasks (seed {seed})")


@app.command("demos")
def demos(
    family: str = typer.Argument(..., help="Task family with an oracle: calc."),
    out_file: Path = typer.Argument(..., help="JSON Lines file to write: one conversation each."),
    n: int = typer.Option(128, min=1, help="Demonstrations (train-split problems only)."),
    seed: int = typer.Option(1, help="Seed of the draw (use another than the run's task set)."),
    system: str | None = typer.Option(
        None, help="System prompt (default: the tool protocol's, as examples/smollm2-agent.toml)."
    ),
    harness: str = typer.Option(
        "reference",
        help="The conversation's form: reference (the reference agent's tool calls) or "
        "mini-swe-agent (gyre/harness/mini_tools.yaml's text actions; its own system prompt).",
    ),
) -> None:
    """Write the family's oracle executions as chat conversations, for `gyre train sft`.

    Each line is ``{"messages": [...], "tools": [...]}`` (the conversational format TRL's
    SFTTrainer reads too): the system prompt, the task, the oracle's tool call, the tool's
    output and the answer, with the tools the reference agent offers (``--no-delegate``), so
    a warm-up renders them as the rollout will. Held-out problems are never drawn. With
    ``--harness mini-swe-agent`` each line is mini-swe-agent's conversation with our config
    instead: no tools, the actions as bash blocks in text, the answer as its submit command.
    """
    import json

    from gyre.harness.families import problems
    from gyre.harness.families.registry import demonstration
    from gyre.harness.families.toolproto import SYSTEM

    from .mini_tools import demonstration as mini_demonstration
    from .reference_agent import TOOLS

    if harness not in ("reference", "mini-swe-agent"):
        fail("harness demos", f"unknown --harness {harness!r} (known: reference, mini-swe-agent)")
    if harness == "mini-swe-agent" and system is not None:
        fail("harness demos", "--system: mini-swe-agent's comes from gyre/harness/mini_tools.yaml")
    tools = [TOOLS[k] for k in ("read_file", "write_file", "run_command", "submit")]
    head = [{"role": "system", "content": SYSTEM if system is None else system}]
    try:
        lines = [
            json.dumps(
                {"messages": mini_demonstration(demonstration(p))}
                if harness == "mini-swe-agent"
                else {"messages": head + demonstration(p), "tools": tools}
            )
            for p in problems(family, seed, "train", n)
        ]
    except ValueError as e:
        fail("harness demos", first_line(e))
    try:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        out_file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    except OSError as e:
        fail("harness demos", f"cannot write {out_file}: {e.strerror or e}")
    typer.echo(f"{out_file}: {n} {family} {harness} demonstrations (train split, seed {seed})")


@app.command("profiles")
def profiles() -> None:
    """List the built-in harness profiles."""
    from .profiles import builtin_profiles

    typer.echo(f"{'profile':15s} description")
    for name, p in builtin_profiles().items():
        typer.echo(f"{name:15s} {p.description}")
