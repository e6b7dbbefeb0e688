"""Gyre against TRL's GRPOTrainer (GSPO) on the same model, prompts, reward and settings.

    bash scripts/install-trl.sh                  # once: TRL in its own venv (.venv-trl)
    python bench/vs_trl/bench_vs_trl.py                 # the example's 21 steps, seed 0, 64 held-out
    python bench/vs_trl/bench_vs_trl.py --seeds 0 1 2 --precision bf16
    python bench/vs_trl/bench_vs_trl.py --gyre-placement elastic   # Gyre at the placement's E[d] 1.5
    python bench/vs_trl/bench_vs_trl.py --steps 3 --held-out 8 --model runs/tiny-model   # a smoke run

For each seed, one after the other on this machine: ``gyre run examples/smollm2-arith.toml``
(with ``--set`` overrides for steps, seed, task set, precision, placement), then TRL's
``GRPOTrainer`` in ``.venv-trl`` (bench/vs_trl/trl_side.py) with the ``GRPOConfig`` that
``vs_trl_lib.trl_args`` derives from the same Gyre config. Both train on the same task
folders' problems (generated here from the family and seed, in Gyre's task order) and
evaluate the same held-out problems at the same policy versions. Each process tree's peak
memory and CPU are sampled from /proc (bench/proctree.py).

Writes to ``--out`` (default bench/results/vs_trl/): ``vs_trl.json`` (every figure),
``vs_trl.md`` (the table, also printed), ``vs_trl.png`` (held-out accuracy against step
and against wall-clock). docs/training.md ("Gyre vs TRL") says what is matched and what
differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the vs_trl_* modules
sys.path.insert(0, str(ROOT / "bench"))  # proctree, shared with the other benches
sys.path.insert(0, str(ROOT))

from proctree import TreeSampler  # noqa: E402
from vs_trl_gyre import gyre_result, prompt_check, trl_result  # noqa: E402
from vs_trl_lib import PAIRS, PRECISIONS, MappingError, gyre_overrides, trl_args  # noqa: E402
from vs_trl_report import notes, write_report  # noqa: E402


def say(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="examples/smollm2-arith.toml")
    ap.add_argument("--model", default="runs/smollm2", help="HF model directory (both sides)")
    ap.add_argument("--steps", type=int, default=None, help="default: the config's total_steps")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--family", default="arith")
    ap.add_argument("--task-seed", type=int, default=0, help="seed of the problem draw")
    ap.add_argument("--train", type=int, default=256, help="training problems")
    ap.add_argument("--held-out", type=int, default=64, help="held-out problems")
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32")
    ap.add_argument(
        "--gyre-placement",
        choices=list(PAIRS),
        default=None,
        help="default: the config's placement and (phi, mu); a placement given here runs at "
        "its pair for E[d] 1.5",
    )
    ap.add_argument(
        "--gyre-staleness",
        nargs=2,
        metavar=("PHI", "MU"),
        default=None,
        help="Gyre's (phi, mu) instead ('0 1' is on-policy, as TRL is)",
    )
    ap.add_argument("--trl-micro-batch", type=int, default=16, help="completions per TRL forward")
    ap.add_argument(
        "--trl-threads", type=int, default=None, help="torch threads of TRL (default: one per core)"
    )
    ap.add_argument("--trl-python", default=".venv-trl/bin/python")
    ap.add_argument("--out", default="bench/results/vs_trl")
    ap.add_argument("--skip-gyre", action="store_true")
    ap.add_argument("--skip-trl", action="store_true")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="extra Gyre overrides")
    return ap.parse_args()


def fail(msg: str) -> int:
    print(f"bench_vs_trl: {msg}", file=sys.stderr)
    return 2


def check(a: argparse.Namespace, cfg) -> str | None:
    """A user mistake, as one line (None: all good)."""
    if not (Path(a.model) / "config.json").is_file():
        return (
            f"--model {a.model} is not a model directory (scripts/get-smollm2.sh imports SmolLM2)"
        )
    if not a.skip_trl and not Path(a.trl_python).is_file():
        return f"{a.trl_python} does not exist: run scripts/install-trl.sh (or --skip-trl)"
    if (
        a.precision == "bf16" and not a.skip_gyre
    ):  # unknown keys would pass silently: ask the models
        from gyre.runtime.engines import RolloutEngineConfig
        from gyre.train.config import TrainerConfig

        if not all("compute_dtype" in c.model_fields for c in (TrainerConfig, RolloutEngineConfig)):
            return "--precision bf16: this Gyre has no trainer/engine compute_dtype option yet"
    if a.steps < 1 or a.held_out < 1 or a.train < cfg.policy.batch_groups:
        return "--steps and --held-out must be >= 1 and --train at least B"
    return None


def make_tasks(a: argparse.Namespace, out: Path):
    """The task folders Gyre loads, and the same problems as records for TRL."""
    from gyre.harness.families import problems
    from gyre.harness.families.write import folder_name, write_taskset

    train = problems(a.family, a.task_seed, "train", a.train)
    held = problems(a.family, a.task_seed, "held-out", a.held_out)
    d = out / "tasks" / f"{a.family}-s{a.task_seed}-t{a.train}-h{a.held_out}"
    if not (d / ".done").exists():
        write_taskset(train + held, d)
        (d / ".done").write_text("")

    def as_read(p):  # the user message is instruction.md as the harness reads it (its "\n" too)
        text = (d / folder_name(p) / "instruction.md").read_text(encoding="utf-8")
        return dataclasses.replace(p, instruction=text)

    return d, [as_read(p) for p in train], [as_read(p) for p in held]


def run_tree(cmd: list[str], log: Path, marker: str | None = None) -> dict:
    """Run ``cmd`` with its output teed to ``log``; sample its process tree; time the line
    that holds ``marker`` (Gyre's "cells up": its training clock starts there)."""
    t0 = time.time()
    # Ray starts its workers (Gyre's cells) at nice 15; TRL's process runs at the caller's
    # nice. Any other load on the machine would then slow Gyre's cells first: run both at 0.
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT),
        "RAY_worker_niceness": "0",
    }
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    sampler = TreeSampler(p.pid).start()
    t_marker = None
    with open(log, "w") as f:
        assert p.stdout is not None
        for line in p.stdout:
            f.write(line)
            if marker and t_marker is None and marker in line:
                t_marker = time.time()
            if line.startswith(("[gyre run]", "[trl]", "gyre run:")) or "Error" in line:
                print("   " + line.rstrip()[:200], file=sys.stderr, flush=True)
    rc = p.wait()
    mem = sampler.stop()
    return {"rc": rc, "t_popen": t0, "t_marker": t_marker, "process_s": time.time() - t0, **mem}


def run_gyre(a, seed: int, taskset: Path, out: Path) -> dict | None:
    name = f"gyre-s{seed}"
    run_dir = out / "runs" / name
    sets = (
        gyre_overrides(
            steps=a.steps,
            seed=seed,
            precision=a.precision,
            placement=a.gyre_placement,
            out_dir=str(out / "runs"),
            name=name,
            taskset=str(taskset),
            model_dir=a.model,
            pair=a.pair,
        )
        + a.sets
    )
    cmd = [sys.executable, "-m", "gyre.cli", "run", a.config]
    for s in sets:
        cmd += ["--set", s]
    saved = run_dir / "bench_tree.json"
    if (run_dir / "summary.json").is_file() and saved.is_file():  # an interrupted bench goes on
        say(f"Gyre seed {seed}: reusing the finished run in {run_dir}")
        return gyre_result(run_dir, json.loads(saved.read_text()), seed)
    for attempt in range(3):  # Ray's local start gives up after 30 s on a loaded machine
        if run_dir.exists() and not (run_dir / "metrics.jsonl").exists():
            import shutil

            shutil.rmtree(run_dir)
        say(f"Gyre seed {seed} ({a.gyre_placement}): {' '.join(sets[:5])} ...")
        tree = run_tree(cmd, out / f"{name}.log", marker="cells up")
        if (run_dir / "summary.json").is_file():
            saved.write_text(json.dumps(tree))
            return gyre_result(run_dir, tree, seed)
        if (run_dir / "metrics.jsonl").exists():
            break
        if attempt < 2:
            say(f"Gyre seed {seed}: no run (exit {tree['rc']}); attempt {attempt + 2} of 3")
    say(f"Gyre seed {seed} failed: see {out / f'{name}.log'}")
    return None


def run_trl(a, cfg, seed: int, train, held, eval_steps: list[int], out: Path) -> dict | None:
    from gyre.runtime.tasks import TaskStream

    # Gyre's own task stream over the same folders: group g of the run is row g here, and
    # TRL takes its rows in order (shuffle off), B prompts per step
    stream = TaskStream(str(a.taskset), cfg.run.train_tasks, cfg.run.eval_tasks, seed)
    by = {f"train-{p.name}": p for p in train}
    order = [by[stream.task(g).name] for g in range(a.steps * cfg.policy.batch_groups)]
    name = f"trl-s{seed}"
    spec = {
        "model_dir": a.model,
        "precision": a.precision,
        "seed": seed,
        "threads": a.trl_threads,
        "trl_args": trl_args(
            cfg,
            steps=a.steps,
            seed=seed,
            precision=a.precision,
            micro_batch=a.trl_micro_batch,
            output_dir=str(out / "runs" / name),
        ),
        "train": [dataclasses.asdict(p) for p in order],
        "held_out": [dataclasses.asdict(p) for p in held],
        "eval_steps": eval_steps,
        "out": str(out / "runs" / f"{name}.json"),
    }
    (out / "runs").mkdir(parents=True, exist_ok=True)
    spec_path = out / "runs" / f"{name}.spec.json"
    saved = out / "runs" / f"{name}.tree.json"
    if saved.is_file() and Path(spec["out"]).is_file() and _same_spec(spec_path, spec):
        say(f"TRL seed {seed}: reusing the finished run {spec['out']}")  # an interrupted bench
        return trl_result(
            json.loads(Path(spec["out"]).read_text()), json.loads(saved.read_text()), seed
        )
    saved.unlink(missing_ok=True)
    spec_path.write_text(json.dumps(spec, indent=1))
    say(f"TRL seed {seed}: GRPOTrainer, {a.steps} steps, evaluations at {eval_steps} ...")
    tree = run_tree(
        [a.trl_python, str(ROOT / "bench" / "vs_trl" / "trl_side.py"), str(spec_path)],
        out / f"{name}.log",
    )
    if tree["rc"] != 0 or not Path(spec["out"]).is_file():
        say(f"TRL seed {seed} failed (exit {tree['rc']}): see {out / f'{name}.log'}")
        return None
    saved.write_text(json.dumps(tree))
    return trl_result(json.loads(Path(spec["out"]).read_text()), tree, seed)


def _same_spec(path: Path, spec: dict) -> bool:
    """A finished TRL run is reused only for the very same spec (steps, seed, problems...)."""
    try:
        return json.loads(path.read_text()) == json.loads(json.dumps(spec))
    except (OSError, ValueError):
        return False


def main() -> int:
    a = parse()
    from gyre.config import load_config

    try:
        cfg = load_config(a.config, [f"model_dir={a.model}", *a.sets])
    except (FileNotFoundError, ValueError) as e:
        return fail(str(e).splitlines()[0])
    a.steps = a.steps or cfg.policy.total_steps
    try:
        a.pair = (
            None
            if a.gyre_staleness is None
            else (float(a.gyre_staleness[0]), int(a.gyre_staleness[1]))
        )
    except ValueError:
        return fail(f"--gyre-staleness takes a number and a whole number, not {a.gyre_staleness}")
    if a.gyre_placement is None:  # the config's own placement and pair
        a.gyre_placement = cfg.policy.placement.value
        a.pair = a.pair or (cfg.policy.phi, cfg.policy.mu)
    a.pair = a.pair or PAIRS[a.gyre_placement]
    try:  # the pair as Gyre's run will get it, the user's --set last
        pair_sets = [f"policy.placement={a.gyre_placement}", f"policy.phi={a.pair[0]}"]
        load_config(
            a.config, [f"model_dir={a.model}", *pair_sets, f"policy.mu={a.pair[1]}", *a.sets]
        )
    except ValueError as e:
        from pydantic import ValidationError

        from gyre.cli_errors import error_line
        from gyre.validation import validation_line

        why = validation_line(e) if isinstance(e, ValidationError) else error_line(e)
        return fail(f"--gyre-staleness {a.pair[0]:g} {a.pair[1]}: {why}")
    if (msg := check(a, cfg)) is not None:
        return fail(msg)
    try:  # refuse a setting TRL cannot reproduce before anything runs
        trl_args(
            cfg,
            steps=a.steps,
            seed=0,
            precision=a.precision,
            micro_batch=a.trl_micro_batch,
            output_dir="-",
        )
    except MappingError as e:
        return fail(str(e))
    out = (ROOT / a.out) if not Path(a.out).is_absolute() else Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if (
        load > cores
    ):  # measured here at load 30 on 2 cores: 8 x 64 tokens, 1 thread 1.9 s, 2 threads 72 s
        say(
            f"load average {load:.1f} on {cores} cores: the timings will not be a comparison "
            "(multi-threaded torch, TRL's default, suffers most; --trl-threads 1 limits that)"
        )
    taskset, train, held = make_tasks(a, out)
    a.taskset = taskset
    say(f"{len(train)} train and {len(held)} held-out {a.family} problems in {taskset}")
    from vs_trl_lib import eval_versions

    mu = a.pair[1]
    runs, checks = [], []
    for seed in a.seeds:
        g = None if a.skip_gyre else run_gyre(a, seed, taskset, out)
        if g is not None:
            runs.append(g)
        steps = (
            sorted({e["step"] for e in g["evals"]})
            if g
            else eval_versions(a.steps, cfg.run.eval_interval, mu)
        )
        t = None if a.skip_trl else run_trl(a, cfg, seed, train, held, steps, out)
        if t is not None:
            runs.append(t)
            if g is not None:
                checks.append(prompt_check(out / "runs" / f"gyre-s{seed}", t))
        (out / "vs_trl.json").write_text(
            json.dumps({"runs": runs, "prompt_checks": checks}, indent=1)
        )
    if not runs:
        return fail("no run finished")
    md = write_report(out, runs, checks, a, notes(cfg.trainer.objective.ratio_reference))
    print(md)
    say(f"wrote {out / 'vs_trl.md'}, {out / 'vs_trl.json'}, {out / 'vs_trl.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
