"""The task stream: group id g -> the g-th query of a seeded, epoch-by-epoch shuffle of the split.

The policy allocates group ids in dispatch order; mapping them through a fixed
stream makes a run reproducible and lets a resumed run continue the cursor (the
next group id) instead of starting the data over.
"""

from __future__ import annotations

import fnmatch
import random

from gyre.harness.task import Task, load_taskset
from gyre.runtime.seeds import SEED_STRIDE


class TaskSetError(ValueError):
    """The task set or its split cannot serve this run."""


def _pick(tasks: list[Task], names: list[str], what: str) -> list[Task]:
    """The named tasks, in the order named; a name with ``*?[`` is a glob (``train-*``) that
    picks every matching task, sorted (generated sets hold hundreds)."""
    if not names:
        return list(tasks)
    by = {t.name: t for t in tasks}
    picked: dict[str, Task] = {}
    unknown = []
    for n in names:
        hits = sorted(fnmatch.filter(by, n)) if any(c in n for c in "*?[") else [n] * (n in by)
        if not hits:
            unknown.append(n)
        picked.update((h, by[h]) for h in hits)
    if unknown:
        have = sorted(by) if len(by) <= 20 else [*sorted(by)[:20], "..."]
        raise TaskSetError(f"run.{what} names tasks not in the set: {unknown} (have: {have})")
    return list(picked.values())


class TaskStream:
    def __init__(self, taskset: str, train: list[str], held_out: list[str], seed: int):
        tasks = load_taskset(taskset)
        self.train = _pick(tasks, train, "train_tasks")
        self.eval = _pick(tasks, held_out, "eval_tasks") if held_out else list(self.train)
        self.held_out = bool(held_out)
        self.seed = seed
        self._epochs: dict[int, list[Task]] = {}

    def check_batch(self, batch_groups: int) -> None:
        """A batch holds B different queries: B larger than the split would repeat one inside a batch."""
        if batch_groups > len(self.train):
            raise TaskSetError(
                f"policy.batch_groups={batch_groups} needs at least {batch_groups} training tasks "
                f"for one batch without repetition; the split has {len(self.train)}"
            )

    def task(self, group_id: int) -> Task:
        n = len(self.train)
        epoch, i = divmod(group_id, n)
        order = self._epochs.get(epoch)
        if order is None:
            order = list(self.train)
            random.Random(self.seed * SEED_STRIDE + epoch).shuffle(order)
            self._epochs[epoch] = order
        return order[i]
