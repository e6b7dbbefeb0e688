"""`gyre sim ...`: simulate placements on a preset workload, or sweep seeds and parameters.

Heavy imports (numpy, matplotlib) stay inside the commands so ``gyre --help`` is fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import NoReturn

import typer

from gyre.cli_errors import fail, first_line
from gyre.validation import validation_line

app = typer.Typer(
    help="Scheduling simulator: compare Colocate, Async and Elastic placements in virtual time.",
    invoke_without_command=True,
    pretty_exceptions_enable=False,
)

PLACEMENT_CHOICES = ("colocate", "async", "async-streaming", "elastic", "all")


def _fail(msg: str) -> NoReturn:
    fail("sim", msg)


def _load(preset: str, sets: list[str], seed: int | None):
    from pydantic import ValidationError

    from gyre.sim.config import apply_overrides
    from gyre.sim.presets import preset as get_preset

    try:
        cfg = get_preset(preset)
        if sets:
            cfg = apply_overrides(cfg, sets)
        if seed is not None:
            cfg = cfg.model_copy(update={"seed": seed})
    except ValidationError as e:
        _fail(validation_line(e))
    except ValueError as e:
        _fail(first_line(e))
    return cfg


def _print_table(cfg, results) -> None:
    from rich.console import Console, JustifyMethod
    from rich.table import Table

    from gyre.sim.presets import PUBLISHED

    pub = PUBLISHED.get(cfg.name, {})
    ref = results.get("elastic")
    p = cfg.policy
    t = Table(
        title=f"{cfg.name} (seed {cfg.seed}): K={p.cells} cells x C_e={p.cell_capacity}"
        + (f" + C_s={p.standalone_capacity}" if p.standalone_capacity else "")
        + f", N={p.group_size}, B={p.batch_groups}, {p.total_steps} steps",
        title_justify="left",
    )
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("placement", "left"),
        ("phi,mu", "center"),
        ("hours", "right"),
        ("x elastic", "right"),
        ("paper h (x)", "right"),
        ("bound", "right"),
        ("eff.", "right"),
        ("E\\[d] real/exp", "right"),
        ("served", "right"),
        ("train", "right"),
        ("idle cell-h", "right"),
        ("interrupted", "right"),
    )
    for col, just in columns:
        t.add_column(col, justify=just, no_wrap=True)
    for name, r in results.items():
        ratio = f"{r.makespan_h / ref.makespan_h:.2f}x" if ref else "-"
        p = pub.get(name)
        pr = (
            f"{p:.1f}"
            + (f" ({p / pub['elastic']:.2f}x)" if "elastic" in pub and name != "elastic" else "")
            if p
            else "-"
        )
        t.add_row(
            name,
            f"{r.phi:g},{r.mu}",
            f"{r.makespan_h:.2f}",
            ratio,
            pr,
            f"{r.lower_bound_h:.2f}",
            f"{r.efficiency:.0%}",
            f"{r.mean_staleness:.2f}/{r.expected_staleness:.2f}",
            f"{r.serving_staleness:.2f}/{r.serving_staleness_tokens:.2f}",
            f"{r.mean_training_share:.0%}",
            f"{r.idle_cell_hours:.1f}",
            str(r.interrupted_executions),
        )
    console = Console(width=None if sys.stdout.isatty() else 150)
    console.print(t)
    console.print(
        "[dim]hours = makespan; x elastic = makespan / Elastic's on the same draw; paper h = published hours "
        "(the seed's toy for seed-toy); bound = makespan no schedule can beat on this draw, eff. = bound / "
        "makespan; E\\[d] = mean staleness realised over trained groups (by dispatch version) / phi + (mu-1)/2; "
        "served = by the version that served each call, per execution / per token; train = mean share "
        "of time cells spend in training; interrupted must be 0.[/dim]"
    )


def _print_bursts(results) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 150)
    for name, r in results.items():
        t = Table(title=f"{name}: per burst (mu={r.mu})", title_justify="left")
        for col in (
            "burst",
            "start h",
            "length h",
            "gather h",
            "overhang h",
            "publish h",
            "train-idle cell-h",
            "group wait h",
            "cells",
        ):
            t.add_column(col, justify="right")
        for b in r.bursts:
            t.add_row(
                str(b["burst"]),
                f"{b['start_h']:.2f}",
                f"{b['length_h']:.2f}",
                f"{b['gather_h']:.2f}",
                f"{b['overhang_h']:.2f}",
                f"{b['publish_gap_h']:.2f}",
                f"{b['train_idle_cell_h']:.2f}",
                f"{b['mean_group_wait_h']:.2f}",
                str(b["max_training_cells"]),
            )
        g = sum(b["gather_h"] for b in r.bursts)
        o = sum(b["overhang_h"] for b in r.bursts)
        t.add_row("sum", "", f"{r.makespan_h:.2f}", f"{g:.2f}", f"{o:.2f}", "", "", "", "")
        console.print(t)
    console.print(
        "[dim]gather = burst start (its dispatch) -> its last trained group ready; overhang = -> burst end "
        "(training still on the critical path); publish = end -> next dispatch.[/dim]"
    )


@app.callback()
def sim(
    ctx: typer.Context,
    preset: str = typer.Option(
        "seed-toy", "--preset", "-p", help="seed-toy | nl2repo-122b | flagship-2.4t | cells-k3"
    ),
    placement: str | None = typer.Option(
        None,
        "--placement",
        help="colocate|async|async-streaming|elastic|all (default: all; with --workload: the run's)",
    ),
    seed: int | None = typer.Option(
        None, "--seed", help="workload draw seed (default: the preset's)"
    ),
    sets: list[str] = typer.Option(
        [], "--set", help="override: name=value (e.g. tail=0.75, costs.optim_h=0.1)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of a table"),
    plot: Path | None = typer.Option(None, "--plot", help="write a Gantt chart PNG here"),
    bursts: bool = typer.Option(
        False,
        "--bursts",
        help="also print where each burst's time goes (gather vs training overhang)",
    ),
    workload: list[Path] = typer.Option(
        [],
        "--workload",
        help="replay RUN_DIR/workload.json of a real run (repeat for one run per placement); "
        "prints measured vs predicted",
    ),
    out: Path | None = typer.Option(
        None, "--out", help="with --workload: also write the comparison as JSON here"
    ),
    faults: str | None = typer.Option(
        None,
        "--faults",
        help="fault schedule, e.g. 'cell=1@300s,restart=60s;cell=2@1h': prints the makespan "
        "with and without it (same seed)",
    ),
) -> None:
    """Simulate one preset for one or all placements on the same workload draw."""
    if ctx.invoked_subcommand is not None:
        return
    if workload:
        if sets or seed is not None or bursts:
            _fail("--set, --seed and --bursts do not apply to --workload (the run fixes them)")
        from gyre.sim.replay_cli import replay_command

        replay_command(workload, placement, as_json=as_json, out=out, plot=plot)
        return
    placement = placement or "all"
    if placement not in PLACEMENT_CHOICES:
        _fail(f"--placement must be one of {', '.join(PLACEMENT_CHOICES)}, got {placement!r}")
    if plot is not None and not plot.parent.is_dir():  # before simulating, not after
        _fail(f"--plot {plot}: cannot write it (no directory {plot.parent})")
    cfg = _load(preset, sets, seed)
    names = list(cfg.placements) if placement == "all" else [placement]
    for n in names:
        if n not in cfg.placements:
            _fail(f"placement {n!r} is not configured in this preset")
    if faults is not None:
        _fault_table(cfg, names, faults, as_json)
        return
    _simulate_and_print(cfg, names, placement, plot, bursts, as_json)


def _simulate_and_print(
    cfg, names: list[str], placement: str, plot: Path | None, bursts: bool, as_json: bool
) -> None:
    """Simulate ``names`` on one draw; print the table (or JSON), write the plot if asked."""
    from gyre.sim.run import simulate

    results = simulate(cfg, names, record=plot is not None or bursts or as_json)
    if plot is not None:
        from gyre.sim.plot import plot_gantt

        try:
            plot_gantt(results, plot, title=f"{cfg.name}, seed {cfg.seed}")
        except OSError as e:
            _fail(f"--plot {plot}: cannot write it ({e.strerror or e})")
        except ValueError as e:  # a file extension matplotlib cannot write
            _fail(f"--plot {plot}: {e}; use a .png, .pdf or .svg name")
    if as_json:
        if placement == "all":
            obj = {n: r.to_dict() for n, r in results.items()}
        else:
            obj = results[names[0]].to_dict()
        typer.echo(json.dumps(obj))
    else:
        _print_table(cfg, results)
        if bursts:
            _print_bursts(results)
        if plot is not None:
            typer.echo(f"plot: {plot}")


def _fault_table(cfg, names: list[str], spec: str, as_json: bool) -> None:
    """``--faults``: each placement's makespan without and with the schedule, on one draw."""
    from gyre.sim.faults import fault_cost, parse_faults

    try:
        schedule = parse_faults(spec, cfg.policy.cells, cfg.policy.standalone_capacity)
    except ValueError as e:
        _fail(f"--faults: {e}")
    rows = [fault_cost(cfg, n, schedule) for n in names]
    if as_json:
        typer.echo(json.dumps(rows))
        return
    for r in rows:
        if not r["survived"]:
            typer.echo(f"{r['placement']:>16}: not survived ({r.get('why', 'never finished')})")
            continue
        typer.echo(
            f"{r['placement']:>16}: makespan {r['makespan_h']:.3f} h -> "
            f"{r['makespan_faults_h']:.3f} h with faults (cost {r['cost_h']:+.3f} h)"
        )


def _print_bands(console, preset: str, band_list, interrupted: int) -> None:
    from rich.table import Table

    b0 = band_list[0]
    t = Table(
        title=f"{preset}: makespan / Elastic's over {b0.points} points x {b0.seeds} seeds",
        title_justify="left",
    )
    for col in (
        "placement",
        "preset: median (p10-p90)",
        "band of medians",
        "with seed spread",
        "median h band",
        "published h",
        "published",
        "inside",
    ):
        t.add_column(col, justify="left" if col == "placement" else "right")
    for b in band_list:
        inside = "-" if b.inside is None else ("yes" if b.inside else "no")
        if b.inside is False and b.inside_spread:
            inside = "spread only"
        t.add_row(
            b.placement,
            f"{b.preset_ratio:.2f}x ({b.preset_p10:.2f}-{b.preset_p90:.2f})",
            f"{b.lo:.2f}-{b.hi:.2f}x",
            f"{b.envelope_lo:.2f}-{b.envelope_hi:.2f}x",
            f"{b.hours_lo:.2f}-{b.hours_hi:.2f}",
            "-" if b.published_h is None else f"{b.published_h:g}",
            "-" if b.published is None else f"{b.published:.3f}x",
            inside,
        )
    console.print(t)
    console.print(
        "[dim]band of medians = min-max over the points of the median per-seed ratio; with seed "
        f"spread = widest p10-p90 of per-seed ratios; interrupted executions: {interrupted}[/dim]"
    )


@app.command("pairs")
def pairs(
    target: float = typer.Option(1.5, "--target", help="mean staleness E[d] to hold"),
    batch_groups: int | None = typer.Option(
        None, "--batch-groups", "-B", help="require phi*B whole groups"
    ),
    max_mu: int = typer.Option(8, "--max-mu"),
) -> None:
    """List the (phi, mu) pairs each placement can run at a target E[d] = phi + (mu-1)/2."""
    from gyre.policy import Placement, staleness_pairs

    if target < 0:
        _fail("--target must be >= 0")
    for pl in Placement:
        ps = staleness_pairs(pl, target, batch_groups, max_mu)
        typer.echo(f"{pl.value:<9} " + (", ".join(f"({p:g}, {m})" for p, m in ps) or "none"))


@app.command("sweep")
def sweep(
    preset: str = typer.Option("seed-toy", "--preset", "-p", help="base preset"),
    study: str | None = typer.Option(
        None,
        "--study",
        help="built-in point set: defaults | observations (the seed's three, on seed-toy) | "
        "table1 (on nl2repo-122b) | bands (the preset over what the paper does not state)",
    ),
    grid: list[str] = typer.Option(
        [], "--grid", help="name=v1,v2,... (repeat for a cartesian product)"
    ),
    seeds: int = typer.Option(20, "--seeds", min=1, help="draws per point"),
    first_seed: int = typer.Option(0, "--first-seed"),
    sets: list[str] = typer.Option([], "--set", help="override applied to every point"),
    placement: str = typer.Option("all", "--placement"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run many seeds (and parameter points); print medians, 10-90 % spread and ratios to Elastic."""
    from pydantic import ValidationError
    from rich.console import Console
    from rich.progress import Progress

    from gyre.sim.sweep import run_sweep

    cfg = _load(preset, sets, None)
    if placement not in PLACEMENT_CHOICES:
        _fail(f"--placement must be one of {', '.join(PLACEMENT_CHOICES)}, got {placement!r}")
    if study and grid:
        _fail("use either --study or --grid, not both")
    try:
        points, names = _sweep_points(cfg, study, grid, placement)
        err = Console(stderr=True)
        with Progress(console=err, transient=False) as prog:
            task = prog.add_task("simulating", total=len(points) * seeds)
            summaries = run_sweep(
                cfg,
                points,
                seeds,
                names,
                progress=lambda _l: prog.advance(task),
                first_seed=first_seed,
            )
    except ValidationError as e:
        _fail(validation_line(e))
    except ValueError as e:
        _fail(first_line(e))
    band_list = None
    if study == "bands" and "elastic" in summaries[0].makespan:
        from gyre.sim.bands import bands
        from gyre.sim.presets import PUBLISHED

        band_list = bands(summaries, PUBLISHED.get(cfg.name, {}))
    if as_json:
        obj: dict = {"preset": cfg.name, "seeds": seeds, "points": [s.to_dict() for s in summaries]}
        if band_list is not None:
            obj["bands"] = [b.to_dict() for b in band_list]
        typer.echo(json.dumps(obj))
        return
    console = Console(width=None if sys.stdout.isatty() else 120)
    if band_list is not None:
        _print_bands(console, cfg.name, band_list, sum(s.interrupted for s in summaries))
        return
    _print_sweep(console, cfg.name, seeds, summaries)
    sys.stdout.flush()


def _sweep_points(
    cfg, study: str | None, grid: list[str], placement: str
) -> tuple[dict, list[str] | None]:
    """The sweep's parameter points (by label) and the placements to run (None: all)."""
    from gyre.sim.sweep import STUDIES, grid_points

    names: list[str] | None = None if placement == "all" else [placement]
    if grid:
        return {", ".join(f"{k}={v}" for k, v in p.items()): p for p in grid_points(grid)}, names
    if study == "bands":
        from gyre.sim.bands import BAND_PLACEMENTS, band_points

        return band_points(cfg.name, cfg.policy.cell_capacity), names or BAND_PLACEMENTS.get(
            cfg.name
        )
    name = study or "defaults"
    if name not in STUDIES:
        _fail(f"unknown study {name!r}; choose one of {sorted(STUDIES)}")
    return STUDIES[name], names


def _print_sweep(console, preset_name: str, seeds: int, summaries: list) -> None:
    """One table per point: each placement's median makespan, spread and ratios to Elastic."""
    from rich.table import Table

    for s in summaries:
        t = Table(title=f"{preset_name}: {s.label} ({seeds} seeds)", title_justify="left")
        for col in (
            "placement",
            "median h",
            "p10-p90 h",
            "median / elastic median",
            "per-seed ratio median",
        ):
            t.add_column(col, justify="right" if col != "placement" else "left")
        d = s.to_dict()["placements"]
        for n, v in d.items():
            t.add_row(
                n,
                f"{v['makespan_h_median']:.2f}",
                f"{v['makespan_h_p10']:.2f}-{v['makespan_h_p90']:.2f}",
                f"{v['ratio_of_medians_vs_elastic']:.2f}x"
                if v["ratio_of_medians_vs_elastic"]
                else "-",
                f"{v['ratio_vs_elastic_median']:.2f}x" if v["ratio_vs_elastic_median"] else "-",
            )
        console.print(t)
        console.print(f"[dim]interrupted executions across all runs: {s.interrupted}[/dim]")
