"""Named workloads. Numbers come from workload statistics only (never from speedups).

* ``seed-toy``: the long seed's toy simulator (8 cells x 8 executions, 4 groups of
  4 attempts per step, 12 steps, lognormal around 1.5 h with a per-query factor,
  4.5 h timeout, E[d] = 1.5 for all). The seed does not give its tail sigma,
  query factor or training cost; we use tail 0.5 (between its sweep values 0.2
  and 0.75), query sigma 0.3, and 4 cell-hours per step (0.5 h on the whole pool;
  its sweep *lowers* training cost to 0.25 h, so the default is above that).
  Streaming cuts groups into *small* micro-steps: with only B N = 16 executions per
  step, one micro-step per execution would be 15 cell-minutes, so the toy cuts each
  execution into 16 (256 micro-steps per step, like the 122B preset's 512).
* ``nl2repo-122b``: 8 cells, C_e = 144, N = 16, B = 32, 12 steps; durations fitted
  to mean execution 1.93 h, mean query 2.96 h, 9.51 % of queries >= 4 h (4 h read
  as the harness timeout); training cost fitted so Elastic's mean training share
  is 23.0 % (paper, Figure 6).
* ``flagship-2.4t``: 4 cells, 48 steps, N = 16, B = 32; durations fitted to 61.1 %
  of queries >= 4 h, 38.2 % of those with the slowest attempt killed by the
  overall timeout, 9.37 % harness timeouts and 4.63 % overall timeouts per
  execution. Not stated by the paper, so assumed: B = 32, the same total rollout
  concurrency as the 122B cluster (4 x 288 = 1152), a 15-minute mean scoring
  time, Async training on 2 of 4 cells, and the 122B run's 23 % training share.

* ``cells-k3``: where Elastic lost to Async (issue 24): ``examples/longtail-cells.toml``'s
  shape (K = 3 cells of C_e = 8, N = 8, B = 2, 24 steps, the E[d] = 1.5 pairs, tau = 0) in a
  training-heavy regime. Its times are that run's *seconds* read as hours (the simulator has
  no absolute time scale when tau = 0, so every makespan is the regime's seconds). Durations
  are the file's draw (tail 0.8, query sigma 0.5) with a 1.5 s median (its 2 s draw less the
  faster machine); costs assumed, picked so Colocate / Elastic and Async / Elastic match the
  measured 1.17x and 0.95x: 0.2 s micro-step, 1 s optimizer step, 0.5 s publication (and
  stall), 2.5 s switch in and 1.25 s back, 0.3 s satellite refresh, 0.5 s reroute.

The two paper presets also carry the costs issue 10 added (``paper_costs``), none
of them stated by the paper, so all assumed: a colocated engine reshards each way
as slowly as an Elastic cell switches (8.52 s in, 3.46 s back); every engine
stalls for the whole publication; a satellite refreshes its weights in one
publication's time; a rerouted call costs 30 s (one slow model call). seed-toy
keeps them at 0: the seed's toy models none of them.
"""

from __future__ import annotations

from gyre.policy.config import Placement, PolicyConfig
from gyre.sim.config import SECOND_H, SIM_HOLD_TAU_H, CostConfig, SimConfig, WorkloadConfig


def _rules(
    *,
    cells: int,
    cell_capacity: int,
    group_size: int,
    batch_groups: int,
    total_steps: int,
    micro_steps_per_execution: int = 1,
) -> PolicyConfig:
    """A preset's shared policy: its cluster and batch shape; rho_min 0.25, tau 2 min."""
    return PolicyConfig(
        placement=Placement.ELASTIC,
        rho_min=0.25,
        hold_tau=SIM_HOLD_TAU_H,
        cells=cells,
        cell_capacity=cell_capacity,
        group_size=group_size,
        batch_groups=batch_groups,
        total_steps=total_steps,
        micro_steps_per_execution=micro_steps_per_execution,
    )


NL2REPO_TARGETS = {
    "mean_execution_h": 1.93,
    "mean_query_h": 2.96,
    "frac_queries_ge_threshold": 0.0951,
}
FLAGSHIP_TARGETS = {
    "frac_queries_ge_threshold": 0.611,
    "frac_long_queries_slowest_missing": 0.382,
    "frac_harness_timeout": 0.0937,
}
# Also reported (per execution), not fitted: our model cannot hit all four at once (docs/scheduling.md).
FLAGSHIP_CHECK = {"frac_missing": 0.0463}

# Paper numbers we compare against (hours), for docs and the CLI's "published" column.
PUBLISHED = {
    "nl2repo-122b": {"elastic": 16.1, "colocate": 23.2, "async": 25.1, "async-streaming": 22.2},
    "flagship-2.4t": {"elastic": 75.42, "colocate": 91.47, "async": 134.55},
    "seed-toy": {"elastic": 13.5, "colocate": 18.1, "async": 22.1, "async-streaming": 18.5},
}


REROUTE_H = 30 * SECOND_H  # assumed: one slow model call (recomputed prefix on another engine)


def paper_costs(train_step_cell_h: float, publish_h: float, optim_h: float) -> CostConfig:
    """A paper preset's costs, with the issue-10 costs at their assumed values (see above)."""
    return CostConfig(
        train_step_cell_h=train_step_cell_h,
        optim_h=optim_h,
        publish_h=publish_h,
        reshard_to_training_h=8.52 * SECOND_H,
        reshard_to_rollout_h=3.46 * SECOND_H,
        publish_stall_h=publish_h,
        satellite_refresh_h=publish_h,
        reroute_delay_h=REROUTE_H,
    )


def _seed_toy() -> SimConfig:
    return SimConfig(
        name="seed-toy",
        description="the long seed's toy: 8 cells x 8 executions, 4 groups x 4 attempts, 12 steps",
        # "cuts them into small micro-steps": 16 per execution gives 256 micro-steps per step
        # (the 122B preset has 512), instead of 16 indivisible 15-cell-minute chunks
        policy=_rules(
            cells=8,
            cell_capacity=8,
            group_size=4,
            batch_groups=4,
            total_steps=12,
            micro_steps_per_execution=16,
        ),
        workload=WorkloadConfig(median_h=1.5, tail=0.5, query_sigma=0.3, harness_timeout_h=4.5),
        costs=CostConfig(train_step_cell_h=4.0),
    )


def _nl2repo() -> SimConfig:
    return SimConfig(
        name="nl2repo-122b",
        description="122B on NL2RepoBench, first 12 steps on 32 nodes (8 cells of 4)",
        policy=_rules(cells=8, cell_capacity=144, group_size=16, batch_groups=32, total_steps=12),
        workload=WorkloadConfig(
            median_h=NL2REPO_FIT["median_h"],
            tail=NL2REPO_FIT["tail"],
            query_sigma=NL2REPO_FIT["query_sigma"],
            harness_timeout_h=4.0,
        ),
        costs=paper_costs(NL2REPO_TRAIN_CELL_H, publish_h=1 / 60, optim_h=1 / 60),
    )


def _flagship() -> SimConfig:
    return SimConfig(
        name="flagship-2.4t",
        description="2.4T flagship, 48 steps on 4 cells of 48 nodes",
        policy=_rules(cells=4, cell_capacity=288, group_size=16, batch_groups=32, total_steps=48),
        workload=WorkloadConfig(
            median_h=FLAGSHIP_FIT["median_h"],
            tail=FLAGSHIP_FIT["tail"],
            query_sigma=FLAGSHIP_FIT["query_sigma"],
            harness_timeout_h=4.0,
            score_mean_h=0.25,
            overall_timeout_h=FLAGSHIP_FIT["overall_timeout_h"],
        ),
        costs=paper_costs(FLAGSHIP_TRAIN_CELL_H, publish_h=2 / 60, optim_h=2 / 60),
    )


# Frozen outputs of `python -m gyre.sim.calibrate` (see tests/unit/test_sim_presets.py).
NL2REPO_FIT = {"median_h": 1.8312, "tail": 0.2645, "query_sigma": 0.1878}
NL2REPO_TRAIN_CELL_H = 1.775
FLAGSHIP_FIT = {
    "median_h": 1.3749,
    "tail": 0.6692,
    "query_sigma": 0.5621,
    "overall_timeout_h": 4.4599,
}
FLAGSHIP_TRAIN_CELL_H = 1.105


def _cells_k3() -> SimConfig:
    return SimConfig(
        name="cells-k3",
        description="examples/longtail-cells.toml's shape, training-heavy (times: seconds as h)",
        policy=PolicyConfig(
            placement=Placement.ELASTIC,
            rho_min=0.25,
            hold_tau=0.0,
            cells=3,
            cell_capacity=8,
            group_size=8,
            batch_groups=2,
            total_steps=24,
        ),
        workload=WorkloadConfig(median_h=1.5, tail=0.8, query_sigma=0.5, harness_timeout_h=14.0),
        costs=CostConfig(
            train_step_cell_h=0.2 * 2 * 8,  # 0.2 s per micro-step, B N = 16 per step
            optim_h=1.0,
            publish_h=0.5,
            publish_stall_h=0.5,
            switch_to_training_h=2.5,
            switch_to_rollout_h=1.25,
            satellite_refresh_h=0.3,
            reroute_delay_h=0.5,
        ),
    )


PRESETS = {
    "seed-toy": _seed_toy,
    "nl2repo-122b": _nl2repo,
    "flagship-2.4t": _flagship,
    "cells-k3": _cells_k3,
}


def preset(name: str) -> SimConfig:
    """The named preset as a fresh ``SimConfig``."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()
