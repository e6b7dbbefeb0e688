"""Run K cells as local OS processes (gloo on 127.0.0.1): tests, benchmarks, single-host use.

Each process is one cell: rank 0 the core, ranks 1..K-1 satellites. The processes
start once, build the gloo world, the prefix communicators and a TCPStore-backed
coordinator, then run a list of *runs* in order (so a test pays the process and
torch start-up once for several scenarios). A run describes the data (synthetic
groups, named as such), how many steps, and per satellite when it joins each step
(after how many micro-steps were done) and how many micro-steps it may take.

Results land in ``out_dir/<run name>/``: ``final.safetensors`` (core weights after the
run), ``metrics.jsonl`` (core; ``cells_joined``/``cells_missed`` per step),
``cell<k>.json`` (satellite participation, with why it missed a step it planned to join;
:mod:`gyre.train.demo.participation` merges the two).

All cells start a run together (a barrier once every cell has loaded its model), so
start-up skew costs no step; within a run the core never waits for a satellite, as the
policy says: a satellite that arrives after the seal misses that step, and says so.
"""

from __future__ import annotations

import json
import os
import signal
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from gyre.log import setup_from_env
from gyre.ports import free_ports
from gyre.train.config import TrainerConfig

if TYPE_CHECKING:
    from gyre.train.cell import TrainCell


class JoinPlan(BaseModel):
    join: bool = True
    after_done: int = Field(
        0, ge=0, description="join once this many micro-steps of the step are done"
    )
    max_claims: int | None = None


class KillPlan(BaseModel):
    cell: int
    step: int
    after_micro_steps: int = 1


class SyntheticData(BaseModel):
    n_groups: int = 8
    group_size: int = 4
    seed: int = 0
    context_len: tuple[int, int] = (8, 24)
    target_len: tuple[int, int] = (8, 24)
    noise: float = 0.02
    missing_every: int = 0
    branches: int = Field(1, ge=1, description="rows per execution (targets dealt among them)")


class LocalRun(BaseModel):
    name: str
    cfg: TrainerConfig
    steps: int = 1
    data: SyntheticData = SyntheticData()
    source: str = Field(
        "all",
        description="'all': every group ready at start; 'one_per_pump': groups land "
        "one at a time (streaming)",
    )
    whole_batch: bool = False
    core_max_claims: int | None = None
    joins: dict[int, JoinPlan] = Field(
        default_factory=dict, description="satellite cell -> plan (absent: no join)"
    )
    kill: KillPlan | None = None
    resume: bool = False
    fresh_store_namespace: str = ""


def _cell_main(
    rank: int, world: int, dist_port: int, store_port: int, runs_json: str, out_dir: str
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    setup_from_env()  # a spawned process: `gyre --log-format/--log-level`, exported by the CLI
    import torch

    torch.set_num_threads(1)
    from gyre.train.cell import TrainCell

    cell = TrainCell(rank, world, dist_port=dist_port, store_port=store_port)
    cell.setup()
    try:
        for raw in json.loads(runs_json):
            _run_one(cell, LocalRun.model_validate(raw), Path(out_dir))
            cell.barrier()
    finally:
        cell.teardown()


def _run_one(cell, run: LocalRun, out: Path) -> None:
    from gyre.train.checkpoint import latest_checkpoint, load_state
    from gyre.train.weights import FileWeightChannel

    rdir = out / run.name
    rdir.mkdir(parents=True, exist_ok=True)
    ns = run.name + run.fresh_store_namespace
    weights = FileWeightChannel(rdir / "weights")
    ckpt = latest_checkpoint(run.cfg.checkpoint.dir) if run.resume else None
    first = load_state(ckpt).step if ckpt else 0
    cell.barrier()  # everyone has read the starting step before the core can move on
    if cell.rank == 0:
        _run_core(cell, run, rdir, ns, weights, first)
    else:
        _run_satellite(cell, run, rdir, ns, weights, first)


def _kill_hook(run: LocalRun, rank: int, step: int):
    """The micro-step hook for ``step``: SIGKILL this cell where ``run.kill`` says."""

    def hook(n):
        k = run.kill
        if k is not None and k.cell == rank and k.step == step and n >= k.after_micro_steps:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def _synthetic_groups(run: LocalRun) -> list:
    """The run's synthetic groups, sampled from its starting model (loaded for this, then freed)."""
    from gyre.train.demo.synthetic import synthetic_groups
    from gyre.train.replica import load_causal_lm

    d = run.data
    gen_model = load_causal_lm(run.cfg.model_dir, run.cfg.dtype)
    groups = synthetic_groups(
        gen_model,
        d.n_groups,
        d.group_size,
        seed=d.seed,
        context_len=d.context_len,
        target_len=d.target_len,
        noise=d.noise,
        missing_every=d.missing_every,
        branches=d.branches,
    )
    del gen_model
    return groups


def _coordinator(cell: TrainCell, namespace: str, cfg: TrainerConfig):
    from gyre.train.demo.coordinator import StoreCoordinator

    return StoreCoordinator(
        cell.store,
        namespace,
        poll_s=cfg.stream.poll_s,
        stall_timeout_s=cfg.stream.stall_timeout_s,
    )


def _core(cell: TrainCell, cfg: TrainerConfig, namespace: str, weights):
    """The core replica of this cell (cell 0 only); call ``start()`` on it."""
    from gyre.train.demo.core import Core

    if not cell.is_core:
        raise RuntimeError(f"cell {cell.rank} is a satellite; the core is cell 0")
    return Core(cfg, _coordinator(cell, namespace, cfg), weights, cell.comm)


def _satellite(cell: TrainCell, cfg: TrainerConfig, namespace: str, weights):
    from gyre.train.demo.satellite import Satellite

    return Satellite(cell.rank, cfg, _coordinator(cell, namespace, cfg), weights, cell.comm)


def _run_core(cell, run: LocalRun, rdir: Path, ns: str, weights, first: int) -> None:
    from safetensors.torch import save_file

    from gyre.train.weights import named_params

    groups = _synthetic_groups(run)
    core = _core(cell, run.cfg, ns, weights)
    core.start(resume=run.resume)
    pending = list(groups)

    def one_per_pump():
        return [pending.pop(0)] if pending else []

    if run.source == "all":
        core.add_groups(groups)
    planned = sorted(c for c, p in run.joins.items() if p.join and 0 < c < cell.world)
    cell.barrier()  # every cell is loaded: the first step is not lost to start-up skew
    with (rdir / "metrics.jsonl").open("a") as f:
        for s in range(first, run.steps):
            res = core.run_step(
                source=one_per_pump if run.source != "all" else None,
                whole_batch=run.whole_batch,
                max_claims=run.core_max_claims,
                on_microstep=_kill_hook(run, cell.rank, s),
            )
            f.write(
                json.dumps(
                    {
                        "step": s,
                        "version": res.policy_version,
                        **res.metrics,
                        "claims": res.seal.claims,
                        "cells_joined": list(range(res.seal.participants)),
                        "cells_missed": [c for c in planned if c >= res.seal.participants],
                        "groups": res.seal.meta.get("groups", []),
                    }
                )
                + "\n"
            )
            f.flush()
    save_file(named_params(core.model), str(rdir / "final.safetensors"))
    core.stop()


def _run_satellite(cell, run: LocalRun, rdir: Path, ns: str, weights, first: int) -> None:
    from gyre.train.demo.participation import OVER_BEFORE_READY, join_when_due

    rank = cell.rank
    plan = run.joins.get(rank)
    sat = _satellite(cell, run.cfg, ns, weights)
    coord = sat.coord
    sat.start()
    cell.barrier()  # pairs with the core's: all cells loaded before the first step
    log = []
    for s in range(first, run.steps):
        if plan is None or not plan.join:
            continue
        res, why = None, OVER_BEFORE_READY
        if sat.wait_for_step(s) is not None:
            join = partial(
                sat.join_step, s, max_claims=plan.max_claims, on_microstep=_kill_hook(run, rank, s)
            )
            res, why = join_when_due(coord, s, plan.after_done, join, poll_s=run.cfg.stream.poll_s)
        log.append(
            {
                "step": s,
                "joined": res is not None,
                "why": why,
                "micro_steps": res.micro_steps if res else 0,
                "compute_s": res.compute_s if res else 0.0,
                "cpu_s": res.cpu_s if res else 0.0,
            }
        )
    (rdir / f"cell{rank}.json").write_text(json.dumps(log))
    sat.stop()


def read_participation(rdir: Path, world: int) -> list:
    """Per step of a finished run: who joined (the core's metrics) and why a planned cell did not
    (its ``cell<k>.json``), as :class:`gyre.train.demo.participation.StepParticipation` records."""
    from gyre.train.demo.participation import step_participation

    accounts: dict[int, dict[int, dict]] = {}
    for c in range(1, world):
        f = rdir / f"cell{c}.json"
        for row in json.loads(f.read_text()) if f.exists() else []:
            accounts.setdefault(row["step"], {})[c] = row
    out = []
    for line in (rdir / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        joined = m.get("cells_joined", list(range(m["train/participants"])))
        planned = [*joined, *m.get("cells_missed", [])]
        out.append(
            step_participation(m["step"], world, len(joined), planned, accounts.get(m["step"]))
        )
    return out


def run_local(
    world: int, runs: list[LocalRun], out_dir: str | Path, *, timeout_s: float = 600.0
) -> None:
    """Spawn ``world`` cell processes, run ``runs`` in order, wait. Raises if any cell fails."""
    import torch.multiprocessing as mp

    payload = json.dumps([r.model_dump(mode="json") for r in runs])
    ctx = mp.start_processes(
        _cell_main,
        args=(world, *free_ports(2), payload, str(out_dir)),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    t0 = time.monotonic()
    while not ctx.join(timeout=1.0):
        if time.monotonic() - t0 > timeout_s:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"local cells did not finish within {timeout_s}s")
