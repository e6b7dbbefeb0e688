"""``gyre runs list|show|compare|health``: what a run directory holds, for a person.

Everything is read from the run directories' files, so these commands work on finished,
killed and still-running runs alike, and on a machine that has none of the run's processes.
"""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    help="Look at run directories: list, show, compare, tool-call health.", no_args_is_help=True
)


def _run_dir(path: Path, what: str) -> Path:
    from gyre.cli_errors import fail
    from gyre.runs.files import is_run_dir

    if not path.is_dir():
        fail(f"runs {what}", f"{path}: no such directory")
    if not is_run_dir(path):
        fail(f"runs {what}", f"{path} is not a run directory (no config.toml)")
    return path


@app.command("list")
def list_runs(out_dir: Path = typer.Argument(..., help="A run.out_dir (or one run directory).")):
    """One line per run: placement, steps done/total, reward first -> last, makespan, state."""
    from gyre.cli_errors import fail
    from gyre.runs.files import find_runs, load_run
    from gyre.runs.listing import line

    if not out_dir.is_dir():
        fail("runs list", f"{out_dir}: no such directory")
    paths = find_runs(out_dir)
    if not paths:
        fail("runs list", f"{out_dir} holds no run directories")
    for p in paths:
        typer.echo(line(load_run(p)))


@app.command("show")
def show(
    run_dir: Path = typer.Argument(..., help="A run directory."),
    out: Path | None = typer.Option(
        None, "-o", "--out", help="HTML file (default RUN_DIR/report.html)."
    ),
):
    """Write one self-contained HTML page about the run (nothing is fetched when opened)."""
    from gyre.cli_errors import fail
    from gyre.runs.files import load_run
    from gyre.runs.safefs import write_text
    from gyre.runs.show import render

    run = load_run(_run_dir(run_dir, "show"))
    target = out or run_dir / "report.html"
    try:  # a new file renamed over the name: a planted link there is replaced, not followed
        write_text(target, render(run, target.parent))
    except OSError as e:
        fail("runs show", f"cannot write {target}: {e.strerror or e}")
    typer.echo(str(target))


@app.command("compare")
def compare(
    run_dirs: list[Path] = typer.Argument(..., help="Two or more run directories."),
    out: Path = typer.Option(Path("compare.html"), "-o", "--out", help="HTML file to write."),
):
    """Several runs' reward and held-out curves and makespans side by side, in one HTML page."""
    from gyre.cli_errors import fail
    from gyre.runs.compare import render_compare
    from gyre.runs.files import load_run
    from gyre.runs.safefs import write_text

    runs = [load_run(_run_dir(p, "compare")) for p in run_dirs]
    try:
        write_text(out, render_compare(runs))
    except OSError as e:
        fail("runs compare", f"cannot write {out}: {e.strerror or e}")
    typer.echo(str(out))


@app.command("health")
def health(
    paths: list[Path] = typer.Argument(
        ..., help="Run directories, folders of trace files, or trace files."
    ),
    harness: list[str] = typer.Option(
        [],
        "--harness",
        help="Harness profile whose role rules read the traces (compactions, sub-agent calls): "
        "once for all PATHs or once per PATH. Default: a run directory's own profile, else "
        "the default rules.",
    ),
):
    """Tool-call health per execution: turns, tool calls, unparsed, truncated, no-call,
    compactions, sub-agent calls (the counts behind a run's tools/* metrics)."""
    from gyre.cli_errors import fail
    from gyre.runs.health import HealthError, rows, source, table

    if len(harness) not in (0, 1, len(paths)):
        fail("runs health", f"--harness given {len(harness)} times for {len(paths)} paths")
    names: list[str | None] = [*harness] if len(harness) == len(paths) else []
    names = names or [harness[0] if harness else None] * len(paths)
    groups = []
    try:
        for path, name in zip(paths, names, strict=True):
            src = source(path, name)
            groups.append((src.profile, rows(src)))
    except HealthError as e:
        fail("runs health", str(e))
    typer.echo(table(groups))
