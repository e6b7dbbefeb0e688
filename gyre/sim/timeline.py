"""What happened in one simulated run, for reports, plots and invariant checks."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Trace:
    """What happened, for reports, plots and invariant checks."""

    cells: int
    segments: list[list[tuple[float, float, str]]]  # per cell: (start, end, role)
    busy: list[list[tuple[float, float]]]  # per cell: merged compute intervals while training
    steps: list[tuple[float, float]] = field(default_factory=list)  # (start, end) per step
    publications: list[float] = field(default_factory=list)
    consumed: list[tuple[int, int, int]] = field(default_factory=list)  # (step, group, version)
    # (time, cell, to-role)
    switch_order: list[tuple[float, int, str]] = field(default_factory=list)
    # (time, running, capacity)
    utilisation: list[tuple[float, int, int]] = field(default_factory=list)
    finish_count: dict[tuple[int, int], int] = field(default_factory=dict)
    optimizer_cells: set[int] = field(default_factory=set)  # ran FinishStep / PublishWeights
    min_slack: float = math.inf  # min over capacity drops of (capacity after - running)
    # group -> time its last execution finished
    group_ready: dict[int, float] = field(default_factory=dict)
    group_assigned: dict[int, float] = field(default_factory=dict)  # group -> time it joined a step
