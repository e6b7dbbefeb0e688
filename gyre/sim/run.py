"""Run placements of one configuration on one shared workload draw."""

from __future__ import annotations

from gyre.sim.config import SimConfig
from gyre.sim.report import SimResult, lower_bound, summarise
from gyre.sim.workload import Draw, draw_workload
from gyre.sim.world import World


def make_draw(cfg: SimConfig) -> Draw:
    """The one draw every placement of ``cfg`` sees (seeded by ``cfg.seed``)."""
    return draw_workload(cfg.workload, cfg.pool_groups(), cfg.policy.group_size, cfg.seed)


def simulate(
    cfg: SimConfig,
    placements: list[str] | None = None,
    *,
    record: bool = True,
    drain: bool = False,
    draw: Draw | None = None,
) -> dict[str, SimResult]:
    """Simulate each placement (default: all in ``cfg.placements``) on the same draw."""
    names = list(cfg.placements) if placements is None else placements
    draw = draw if draw is not None else make_draw(cfg)
    lb = lower_bound(cfg, draw)
    out: dict[str, SimResult] = {}
    for name in names:
        world = World(cfg, name, draw, record=record, drain=drain).run()
        out[name] = summarise(world, lb)
    return out


def run_world(cfg: SimConfig, name: str, *, drain: bool = False, draw: Draw | None = None) -> World:
    """One placement's raw world (trace, counters) for invariant checks."""
    draw = draw if draw is not None else make_draw(cfg)
    return World(cfg, name, draw, record=True, drain=drain).run()
