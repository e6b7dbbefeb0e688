"""Serving-version staleness in the simulator: which policy version sampled each token.

Model calls are spread evenly over an execution's progress, so its tokens are too; an
execution spanning a publication has tokens from both versions, weighted by the progress
made under each. The world tells this book where the progress clock stood at each
publication, launch and finish; it keeps two means over trained executions: per execution
(each counts once, comparable with the policy's dispatch E[d]) and per token (an
execution's tokens are its length, or its calls when the draw knows them).
"""

from __future__ import annotations

from bisect import bisect_right

from gyre.policy import ExecutionId


class ServingStaleness:
    """Staleness by serving version, booked as executions finish and groups are trained."""

    def __init__(self, steady_from_step: int) -> None:
        """``steady_from_step``: the first step of the steady mean (after the first burst)."""
        self._steady_from = steady_from_step
        # (progress, version) at each publication; progress at each execution's launch
        self.pub_P: list[float] = []
        self.pub_v: list[int] = []
        self.P0: dict[ExecutionId, float] = {}
        # gid -> [executions, sum of their mean serving versions, tokens, tokens * version]
        self._group_tokens: dict[int, list[float]] = {}
        # over trained executions: [executions, sum of staleness, tokens, tokens * staleness]
        self.acc = [0.0, 0.0, 0.0, 0.0]
        self.acc_steady = [0.0, 0.0, 0.0, 0.0]  # the same after the first burst

    def published(self, progress: float, version: int) -> None:
        self.pub_P.append(progress)
        self.pub_v.append(version)

    def served(self, p0: float, p1: float) -> float:
        """Tokens x version over the progress span [p0, p1]: the sum of the versions that
        served it, each weighted by the progress (hence tokens) made under it."""
        pubs, vers = self.pub_P, self.pub_v
        i = bisect_right(pubs, p0)
        v = vers[i - 1] if i else 0
        at, acc = p0, 0.0
        while i < len(pubs) and pubs[i] < p1:
            acc += v * (pubs[i] - at)
            at, v = pubs[i], vers[i]
            i += 1
        return acc + v * (p1 - at)

    def finished(self, key: ExecutionId, progress: float, calls: int | None, scored: bool) -> None:
        """Execution ``key`` finished at ``progress``: a scored one books its tokens and their
        mean serving version on its group (``calls``: its tokens when the draw knows them)."""
        p0 = self.P0.pop(key)
        if not scored:
            return
        gid = key[0]
        gt = self._group_tokens.get(gid)
        if gt is None:
            gt = self._group_tokens[gid] = [0.0, 0.0, 0.0, 0.0]
        x = progress - p0
        served = self.served(p0, progress)
        mean_v = served / x if x > 0 else self.served(p0, p0 + 1.0)
        tokens = x if calls is None else calls
        gt[0] += 1.0
        gt[1] += mean_v
        gt[2] += tokens
        gt[3] += tokens * mean_v

    def assigned(self, step: int, group_id: int) -> None:
        """Group ``group_id`` joined ``step``: its executions' staleness is step - version."""
        gt = self._group_tokens.pop(group_id, None)
        if gt is None:
            return
        acc = [gt[0], step * gt[0] - gt[1], gt[2], step * gt[2] - gt[3]]
        for i in range(4):
            self.acc[i] += acc[i]
            if step >= self._steady_from:
                self.acc_steady[i] += acc[i]
