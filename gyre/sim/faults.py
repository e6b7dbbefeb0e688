"""Fault schedules for the simulator: which cell or engine dies when, and how long until it is back.

``gyre sim --faults SPEC`` takes one or more faults separated by ``;``, each
``cell=I@T[,restart=D]``: cell ``I``'s process dies at run time ``T`` and a new one is up
``D`` later (``restart=never``: it stays lost; default ``0s``); or
``engine@T[,slots=S][,restart=D]``: a standalone engine serving ``S`` of the pool's slots
(default: the whole pool) dies at ``T`` and a new one serves ``D`` later. Times take ``s``,
``m`` or ``h`` (bare numbers are hours, the simulator's unit), e.g.
``cell=1@300s,restart=60s``. The world turns each fault into the policy's ``CellLost`` /
``CellBack`` (``EngineLost`` / ``EngineBack``) events, exactly as the runtime does when a
cell actor or standalone engine dies and is restarted; :func:`fault_cost` runs the same seed
with and without the schedule, so the difference is what the faults cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from gyre.policy import PolicyError
from gyre.sim.config import SimConfig
from gyre.sim.run import make_draw
from gyre.sim.world import World

_UNIT_H = {"s": 1 / 3600, "m": 1 / 60, "h": 1.0}


@dataclass(frozen=True)
class Fault:
    cell: int  # -1: a standalone engine
    at_h: float
    restart_h: float | None  # None: never back
    slots: int = 0  # a standalone engine's share of the pool (0: a cell)

    def as_tuple(self) -> tuple[int, float, float | None, int]:
        return (self.cell, self.at_h, self.restart_h, self.slots)


def _hours(text: str, what: str) -> float:
    t = text.strip().lower()
    unit = _UNIT_H.get(t[-1:], None)
    num = t[:-1] if unit is not None else t
    try:
        v = float(num) * (unit if unit is not None else 1.0)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a time (e.g. 300s, 5m, 0.1h)") from None
    if v < 0:
        raise ValueError(f"{what} {text!r} is negative")
    return v


def parse_faults(spec: str, cells: int | None = None, standalone: int | None = None) -> list[Fault]:
    """``cell=1@300s,restart=60s;engine@1h,slots=4`` -> faults, in time order (``standalone``:
    the pool's slots, an engine's default). ``ValueError`` with one line saying what is wrong."""
    out: list[Fault] = []
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        fields = [f.strip() for f in part.split(",")]
        head = fields[0]
        if head.startswith("engine@"):
            cell, at_s = -1, head[len("engine@") :]
            slots = standalone if standalone is not None else 0
        elif head.startswith("cell=") and "@" in head:
            cell_s, at_s = head[5:].split("@", 1)
            slots = 0
            try:
                cell = int(cell_s)
            except ValueError:
                raise ValueError(f"fault {part!r}: cell {cell_s!r} is not an integer") from None
            if cell < 0 or (cells is not None and cell >= cells):
                raise ValueError(f"fault {part!r}: cells are 0..{(cells or 1) - 1}")
        else:
            raise ValueError(f"fault {part!r}: expected cell=I@T[,restart=D] or engine@T[,slots=S]")
        restart: float | None = 0.0
        for f in fields[1:]:
            key, _, val = f.partition("=")
            if key == "slots" and cell < 0:
                try:
                    slots = int(val)
                except ValueError:
                    raise ValueError(f"fault {part!r}: slots {val!r} is not an integer") from None
            elif key == "restart":
                restart = None if val.strip() == "never" else _hours(val, "restart")
            else:
                allowed = "restart=D, slots=S" if cell < 0 else "only restart=D"
                raise ValueError(f"fault {part!r}: unknown field {key!r} ({allowed})")
        if cell < 0 and slots <= 0:
            raise ValueError(f"fault {part!r}: an engine needs slots=S > 0 (no standalone pool?)")
        out.append(Fault(cell, _hours(at_s, "fault time"), restart, slots))
    if not out:
        raise ValueError("--faults is empty: give cell=I@T[,restart=D] or engine@T[,slots=S]")
    return sorted(out, key=lambda f: f.at_h)


def fault_cost(cfg: SimConfig, placement: str, faults: list[Fault]) -> dict[str, object]:
    """Makespan of ``placement`` on one draw without and with ``faults`` (same seed): the
    difference is the faults' predicted cost. A fault the policy cannot survive (the core lost
    while it holds training state) is reported as such, not raised."""
    draw = make_draw(cfg)
    base = World(cfg, placement, draw, record=False).run()
    row: dict[str, object] = {
        "placement": placement,
        "faults": [f.as_tuple() for f in faults],
        "makespan_h": base.makespan,
    }
    try:
        hit = World(
            cfg, placement, draw, record=False, faults=tuple(f.as_tuple() for f in faults)
        ).run()
    except PolicyError as e:
        return row | {"survived": False, "why": str(e)}
    cost = None
    if hit.makespan is not None and base.makespan is not None:
        cost = hit.makespan - base.makespan
    return row | {
        "survived": hit.makespan is not None,
        "makespan_faults_h": hit.makespan,
        "cost_h": cost,
        "rerouted": hit.rerouted,
        "interrupted": hit.interrupted,
        "events": hit.faults.log,
        "protocol_errors": hit.protocol_errors,
    }


def replay_fault_cost(
    src: object, faults: list[Fault], placement: str | None = None, *, spare_reduce: bool = False
) -> dict:
    """A real run's predicted fault cost: its realised workload (``workload.json``, one draw:
    every execution keeps its own measured duration) replayed without and with ``faults``.
    ``spare_reduce``: the faults wait for a step's reduce to end, as an injector that spares
    the reduce does (virtual time differs from the run's, so a kill may land in a simulated
    reduce).

    Replay the run *without* faults for both sides: a faulted run's own file has other
    executions (a different count of groups reshapes the draw that fills unrealised slots), so
    the pair would not hold the per-execution draws fixed."""
    from gyre.sim.replay import load_workload, replay_draw, sim_config

    wf = load_workload(src)  # type: ignore[arg-type]
    name = placement or wf.placement.value
    cfg = sim_config(wf, [name])
    draw, _ = replay_draw(wf, cfg)
    base = World(cfg, name, draw, record=False).run()
    row: dict[str, object] = {"placement": name, "makespan_s": _s(base.makespan)}
    try:
        fs = tuple(f.as_tuple() for f in faults)
        hit = World(cfg, name, draw, record=False, faults=fs, spare_reduce=spare_reduce).run()
    except PolicyError as e:
        return row | {"survived": False, "why": str(e)}
    cost = None
    if hit.makespan is not None and base.makespan is not None:
        cost = (hit.makespan - base.makespan) * 3600.0
    return row | {"survived": True, "makespan_faults_s": _s(hit.makespan), "cost_s": cost}


def _s(h: float | None) -> float | None:
    return None if h is None else h * 3600.0
