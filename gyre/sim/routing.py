"""Which serving unit runs each execution in the simulator: the proxy's routing.

Serving is pooled (the proxy sends each call to the least-occupied rollout engine), so the
world tracks an execution's unit only when a cell leaving rollout costs its executions
something (``reroute_delay_h`` > 0): then it must know which executions that cell served.
"""

from __future__ import annotations

import math

from gyre.policy import CellRole, ExecutionId

STANDALONE = -1  # the standalone rollout pool's unit


class Routing:
    """Executions per serving unit (cells, and :data:`STANDALONE`)."""

    def __init__(self, cells: int, cell_capacity: int, standalone_capacity: int) -> None:
        self._cap = {i: cell_capacity for i in range(cells)} | {STANDALONE: standalone_capacity}
        self._members: dict[int, set[ExecutionId]] = {u: set() for u in self._cap}
        self._where: dict[ExecutionId, int] = {}

    def place(self, key: ExecutionId, roles: list[CellRole]) -> None:
        """Serve ``key`` on the least-occupied unit that serves (a cell in rollout)."""
        best, best_occ = STANDALONE, math.inf
        for u, members in self._members.items():
            if u >= 0:
                if roles[u] is not CellRole.ROLLOUT:
                    continue
            elif self._cap[u] <= 0:
                continue
            occ = len(members) / self._cap[u]
            if occ < best_occ:
                best, best_occ = u, occ
        self._members[best].add(key)
        self._where[key] = best

    def leave(self, cell: int) -> set[ExecutionId]:
        """``cell`` stops serving: the executions it served (the caller places them again)."""
        moved = self._members[cell]
        self._members[cell] = set()
        return moved

    def finished(self, key: ExecutionId) -> None:
        self._members[self._where.pop(key)].discard(key)
