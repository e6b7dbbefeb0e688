"""Results of a simulated run, the makespan lower bound, and the comparison table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gyre.sim.config import SimConfig
from gyre.sim.workload import Draw


@dataclass
class LowerBound:
    """A makespan no schedule can beat on this draw (see docs/scheduling.md).

    * work: the cluster offers (K + C_s/C_e) cell-equivalents per hour; the run must
      roll out and train S*B whole groups; take the S*B groups of least combined
      cost (slot-hours / C_e + their micro-steps' training cell-hours) from the
      draw, plus S optimizer steps on the core.
    * path: step 1 cannot finish before B groups are complete and one optimizer
      step ran; every later step needs the previous step's weights, so its
      micro-steps (at least B * v_min of them, spread over at most K cells) and its
      optimizer step follow in sequence; and the S*B-th fastest query must finish
      before the last step can.
    """

    work_h: float
    path_h: float

    @property
    def hours(self) -> float:
        return max(self.work_h, self.path_h)


def lower_bound(cfg: SimConfig, draw: Draw) -> LowerBound:
    c, p = cfg.costs, cfg.policy
    S, B, N = p.total_steps, p.batch_groups, p.group_size
    micro_h = c.train_step_cell_h / (B * N)
    valid = (~draw.missing).sum(axis=1)
    cost = draw.duration_h.sum(axis=1) / p.cell_capacity + valid * micro_h
    need = S * B
    cheapest = np.sort(cost)[:need].sum()
    work = (cheapest + S * c.optim_h) / (p.cells + p.standalone_capacity / p.cell_capacity)
    q = np.sort(draw.query_h())
    v_min = int(valid.min())
    path_a = q[B - 1] + c.optim_h + (S - 1) * (c.optim_h + B * v_min * micro_h / p.cells)
    path_b = q[need - 1] + c.optim_h
    return LowerBound(work_h=float(work), path_h=float(max(path_a, path_b)))


def burst_breakdown(world) -> list[dict[str, float]]:
    """Where each burst's time goes (needs a world run with ``record=True``).

    A burst (mu steps between publications) starts when its dispatch happens (the
    previous publication; 0 for the first) and ends with its last optimizer step. Its
    length splits exactly into

    * ``gather_h``: start -> the moment the last group it trains became ready (its last
      execution finished); 0 if every group was ready before the burst began. Under
      boundary dispatch this is set by the slowest query among the groups the burst
      needs, whatever the training side does.
    * ``overhang_h``: last group ready -> burst end: training (micro-steps, optimizer
      steps, the previous steps of the burst) still on the critical path.

    plus ``publish_gap_h`` (this burst's end -> the next dispatch). Also reported:
    ``train_idle_cell_h`` (cells in the training role but not computing, inside the
    burst), ``mean_group_wait_h`` (ready -> assigned to a step) and ``max_training_cells``.
    """
    tr = world.trace
    mu = world.pcfg.mu
    ends = [e for _, e in tr.steps]
    by_step: dict[int, list[int]] = {}
    for step, gid, _v in tr.consumed:
        by_step.setdefault(step, []).append(gid)
    out = []
    n_bursts = (len(ends) + mu - 1) // mu
    for b in range(n_bursts):
        start = tr.publications[b - 1] if b > 0 else 0.0
        end = ends[min((b + 1) * mu, len(ends)) - 1]
        gids = [g for s in range(b * mu, min((b + 1) * mu, len(ends))) for g in by_step.get(s, [])]
        ready = [tr.group_ready[g] for g in gids if g in tr.group_ready]
        last_ready = max(ready) if ready else start
        waits = [
            tr.group_assigned[g] - tr.group_ready[g]
            for g in gids
            if g in tr.group_ready and g in tr.group_assigned
        ]
        gather = max(0.0, last_ready - start)
        idle = 0.0
        for cell in range(world.K):
            train_t = sum(
                max(0.0, min(e, end) - max(s0, start))
                for s0, e, r in tr.segments[cell]
                if r == "training"
            )
            busy_t = sum(max(0.0, min(e, end) - max(s0, start)) for s0, e in tr.busy[cell])
            idle += max(0.0, train_t - busy_t)
        max_cells = 0
        for cell in range(world.K):
            if any(r == "training" and s0 < end and e > start for s0, e, r in tr.segments[cell]):
                max_cells += 1
        nxt = tr.publications[b] if b < len(tr.publications) else end
        out.append(
            {
                "burst": b,
                "start_h": start,
                "end_h": end,
                "length_h": end - start,
                "gather_h": gather,
                "overhang_h": end - start - gather,
                "publish_gap_h": max(0.0, nxt - end),
                "train_idle_cell_h": idle,
                "mean_group_wait_h": float(np.mean(waits)) if waits else 0.0,
                "max_training_cells": max_cells,
            }
        )
    return out


@dataclass
class SimResult:
    placement: str
    makespan_h: float
    lower_bound_h: float
    efficiency: float
    interrupted_executions: int
    overbooked_executions: int
    mean_staleness: float
    mean_staleness_steady: float
    expected_staleness: float
    phi: float
    mu: int
    streaming: bool
    step_end_h: list[float]
    step_durations_h: list[float]
    training_share: list[float]
    mean_training_share: float
    idle_cell_hours: float
    idle_share: float
    executions_dispatched: int
    executions_finished: int
    missing_assessments: int
    groups_trained: int
    sim_wall_s: float
    # staleness by the version that served each call (see gyre.sim.world): per trained execution
    # (each once) and per token; steady = after the first burst
    serving_staleness: float = 0.0
    serving_staleness_steady: float = float("nan")
    serving_staleness_tokens: float = 0.0
    serving_staleness_tokens_steady: float = float("nan")
    rerouted_executions: int = 0  # moved off a leaving cell (each lost costs.reroute_delay_h)
    gather_h: float | None = (
        None  # sum of the bursts' gather (None unless recorded); see burst_breakdown
    )
    overhang_h: float | None = None  # sum of the bursts' training overhang
    bursts: list[dict[str, float]] = field(default_factory=list, repr=False)
    timeline: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self, timeline: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not timeline:
            d.pop("timeline")
        return d


def _ratio(num: float, den: float, empty: float = float("nan")) -> float:
    return num / den if den > 0 else empty


def summarise(world, lb: LowerBound) -> SimResult:
    """Turn a finished ``World`` into a ``SimResult``."""
    pc = world.pcfg
    makespan = world.end_time
    tr = world.trace
    K = world.K
    consumed = tr.consumed
    d = [s - v for s, _, v in consumed]
    steady = [s - v for s, _, v in consumed if s >= pc.mu]
    train_share = [
        (world.role_h[i]["training"] + world.role_h[i]["to_training"]) / makespan
        if makespan > 0
        else 0.0
        for i in range(K)
    ]
    train_idle = sum(max(0.0, world.role_h[i]["training"] - world.busy_h[i]) for i in range(K))
    switching = sum(
        world.role_h[i]["to_training"] + world.role_h[i]["to_rollout"] for i in range(K)
    )
    idle = world.idle_slot_h_at_end / world.Ce + train_idle + switching
    ends = [e for _, e in tr.steps]
    starts = [s for s, _ in tr.steps]
    durs = [ends[0]] + [ends[i] - ends[i - 1] for i in range(1, len(ends))] if ends else []
    lbh = lb.hours
    res = SimResult(
        placement=world.name,
        makespan_h=makespan,
        lower_bound_h=lbh,
        efficiency=lbh / makespan if makespan > 0 else 0.0,
        interrupted_executions=world.interrupted,
        overbooked_executions=world.overbooked,
        mean_staleness=float(np.mean(d)) if d else 0.0,
        mean_staleness_steady=float(np.mean(steady)) if steady else float("nan"),
        expected_staleness=pc.expected_staleness,
        phi=pc.phi,
        mu=pc.mu,
        streaming=pc.streaming,
        step_end_h=ends,
        step_durations_h=durs,
        training_share=train_share,
        mean_training_share=float(np.mean(train_share)),
        idle_cell_hours=idle,
        idle_share=idle / (makespan * (K + pc.standalone_capacity / pc.cell_capacity))
        if makespan > 0
        else 0.0,
        executions_dispatched=world.dispatched_execs,
        executions_finished=world.finished_execs,
        missing_assessments=world.missing_execs,
        groups_trained=len(consumed),
        sim_wall_s=world.wall_s,
        serving_staleness=_ratio(world.serving.acc[1], world.serving.acc[0], 0.0),
        serving_staleness_steady=_ratio(world.serving.acc_steady[1], world.serving.acc_steady[0]),
        serving_staleness_tokens=_ratio(world.serving.acc[3], world.serving.acc[2], 0.0),
        serving_staleness_tokens_steady=_ratio(
            world.serving.acc_steady[3], world.serving.acc_steady[2]
        ),
        rerouted_executions=world.rerouted,
    )
    if world.record:
        res.bursts = burst_breakdown(world)
        res.gather_h = float(sum(b["gather_h"] for b in res.bursts))
        res.overhang_h = float(sum(b["overhang_h"] for b in res.bursts))
        res.timeline = {
            "segments": tr.segments,
            "busy": tr.busy,
            "steps": tr.steps,
            "step_starts": starts,
            "publications": tr.publications,
            "utilisation": tr.utilisation,
        }
    return res
