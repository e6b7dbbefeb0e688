"""What the controller pays to send a step's micro-steps to the cells: per claim bytes, per step CPU.

    python bench/bench_claims.py                 # both protocols, the defaults below
    python bench/bench_claims.py --steps 20 --context 3000

Two protocols of ``ClaimMicroStep`` (the policy cuts each group into N * micro_steps_per_execution
micro-steps; each claim is one Ray call to a cell):

* ``resend`` (gyre up to issue 21): the driver encodes the group's tasks to JSON bytes when the
  group is assigned, and every claim of the group carries all of them; the cell decodes all of
  them on every claim (n claims of a group: n transfers, n^2 decodes).
* ``once`` (now): the driver puts the group's tasks in Ray's object store once
  (``Cluster.put_tasks``) and a claim carries that reference; a cell fetches the tasks on its
  first claim of the group and keeps them for the step (``CellTrainer``).

The groups are synthetic, shaped like an agent run's (every execution ``--paths`` admitted paths
of ``--context`` context and ``--targets`` target tokens, packed under ``--token-budget``). The
cells are K local Ray actors that handle the tasks exactly as a cell does (the code paths are
copied from ``gyre.runtime.cell`` / ``gyre.train.trainer``, which need a model) and compute
nothing: the forward/backward is the same under both protocols. Reported: the bytes of one
claim's arguments as Ray serializes them (exact, load does not change them), and per step the
driver's CPU seconds (Ray's threads in the driver included), the wall seconds from the first
claim to the last answer, and the cells' seconds spent decoding/fetching tasks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

import ray

from gyre.train.buffer import ReadyGroup, pack_groups
from gyre.train.config import ObjectiveConfig, StreamConfig
from gyre.train.demo.synthetic import chain_row
from gyre.train.stats import ObjectiveStats
from gyre.train.tasks import MicroStepTask


def make_group(gid: int, a, rng: random.Random) -> ReadyGroup:
    rows, rewards = {}, {}
    for e in range(a.group_size):
        eid = f"g{gid}/e{e}"
        rows[eid] = []
        for _ in range(a.paths):
            row = chain_row(
                [rng.randrange(10, 49000) for _ in range(a.context)],
                [rng.randrange(10, 49000) for _ in range(a.targets)],
                [-rng.random() * 3 for _ in range(a.targets)],
            )
            row.token_weight = [w / a.paths for w in row.token_weight]  # 1/|T_e| over all paths
            rows[eid].append(row)
        rewards[eid] = float(e % 2) + 0.1 * rng.random()
    return ReadyGroup(group_id=f"g{gid}", rewards=rewards, rows=rows)


class StubCell:
    """A cell's handling of the tasks it is sent, without the model."""

    def __init__(self) -> None:
        self.step = -1
        self.cache: dict[int, dict[int, MicroStepTask]] = {}
        self.busy = 0.0

    def compute_resend(self, step: int, version: int, tasks: list[bytes], indices: list[int], _s):
        t0 = time.perf_counter()
        by_index = {t.index: t for t in (MicroStepTask.from_bytes(b) for b in tasks)}
        self.busy += time.perf_counter() - t0
        stats = ObjectiveStats()
        for i in indices:
            stats.add(ObjectiveStats(tokens=by_index[i].n_tokens))
        return stats.as_list()

    def compute_once(self, step: int, version: int, group: int, tasks: list, indices, _s):
        t0 = time.perf_counter()
        if step != self.step:
            self.cache.clear()
            self.step = step
        if group not in self.cache:
            self.cache[group] = {t.index: t for t in ray.get(tasks[0])}
        by_index = self.cache[group]
        self.busy += time.perf_counter() - t0
        stats = ObjectiveStats()
        for i in indices:
            stats.add(ObjectiveStats(tokens=by_index[i].n_tokens))
        return stats

    def take_busy(self) -> float:
        b, self.busy = self.busy, 0.0
        return b


def claim_bytes(args: tuple) -> int:
    """Bytes of one call's arguments as Ray serializes them (inline or via the object store)."""
    ctx = ray._private.worker.global_worker.get_serialization_context()
    return int(ctx.serialize(args).total_bytes)


async def run_step(mode: str, step: int, groups: list[list[MicroStepTask]], cells, n: int):
    """One step: assign every group (encode or put), then all its claims round-robin over the cells."""
    c0, t0 = time.process_time(), time.perf_counter()
    calls, sizes = [], []
    for gid, tasks in enumerate(groups):
        shards = [[t.index for t in tasks[i::n]] for i in range(n)]
        if mode == "resend":
            payload: Any = [t.to_bytes() for t in tasks]
        else:
            payload = [ray.put(tasks)]
        for j, shard in enumerate(shards):
            if not shard:
                continue
            cell = cells[(gid * n + j) % len(cells)]
            if mode == "resend":
                args: tuple = (step, 0, payload, shard, "/snap")
                calls.append(cell.compute_resend.remote(*args))
            else:
                args = (step, 0, gid, payload, shard, "/snap")
                calls.append(cell.compute_once.remote(*args))
            sizes.append(args)
    results = await asyncio.gather(*calls)
    total = ObjectiveStats()
    for r in results:  # the driver's merge of the answers
        total.add(ObjectiveStats.from_list(r) if isinstance(r, list) else r)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    busy = sum(await asyncio.gather(*[c.take_busy.remote() for c in cells]))
    return {"cpu": cpu, "wall": wall, "cell": busy, "claims": len(calls), "tokens": total.tokens}, [
        claim_bytes(a) for a in sizes
    ]


async def main_async(a) -> dict:
    rng = random.Random(a.seed)
    stream = StreamConfig(token_budget=a.token_budget)
    steps, index = [], 0
    for _ in range(a.steps + 1):  # the first step warms up (imports, worker start)
        groups = []
        for g in range(a.batch_groups):
            chunk = pack_groups([make_group(g, a, rng)], index, stream, ObjectiveConfig())
            index += len(chunk.tasks)
            groups.append(chunk.tasks)
        steps.append(groups)
    n = a.group_size * a.micro_steps_per_execution
    ray.init(
        num_cpus=a.cells + 1, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    try:
        cells = [ray.remote(StubCell).options(num_cpus=1).remote() for _ in range(a.cells)]
        await asyncio.gather(*[c.take_busy.remote() for c in cells])
        out: dict = {}
        for mode in ("resend", "once"):
            rows, sizes = [], []
            for s, groups in enumerate(steps):
                row, sz = await run_step(mode, s, groups, cells, n)
                if s:
                    rows.append(row)
                    sizes.extend(sz)
            out[mode] = {
                "bytes_per_claim_mean": statistics.mean(sizes),
                "bytes_per_claim_max": max(sizes),
                "bytes_per_step": sum(sizes) / len(rows),
                "claims_per_step": rows[0]["claims"],
                "driver_cpu_s_per_step_median": statistics.median(r["cpu"] for r in rows),
                "wall_s_per_step_median": statistics.median(r["wall"] for r in rows),
                "cells_task_s_per_step_median": statistics.median(r["cell"] for r in rows),
            }
        tokens = sum(t.n_tokens for g in steps[1] for t in g)
        out["shape"] = {
            "tokens_per_step": tokens,
            "tasks_per_group": [len(g) for g in steps[1]],
            **{k: getattr(a, k) for k in vars(a)},
        }
        return out
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--cells", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch-groups", type=int, default=4)
    ap.add_argument("--micro-steps-per-execution", type=int, default=1)
    ap.add_argument("--paths", type=int, default=2, help="admitted paths per execution")
    ap.add_argument("--context", type=int, default=1500, help="context tokens per path")
    ap.add_argument("--targets", type=int, default=300, help="target tokens per path")
    ap.add_argument("--token-budget", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args()
    r = asyncio.run(main_async(a))
    if a.json:
        print(json.dumps(r, indent=1))
        return
    sh = r["shape"]
    print(
        f"{a.batch_groups} groups x {a.group_size} executions x {a.paths} paths "
        f"({a.context}+{a.targets} tokens), {sh['tokens_per_step']} tokens a step, "
        f"tasks per group {sh['tasks_per_group']}, {r['once']['claims_per_step']} claims a step, "
        f"{a.cells} cells, median of {a.steps} steps"
    )
    hdr = f"{'protocol':<10}{'B/claim':>12}{'MB/step':>10}{'driver CPU s':>14}{'wall s':>9}{'cells s':>9}"
    print(hdr)
    for mode in ("resend", "once"):
        m = r[mode]
        print(
            f"{mode:<10}{m['bytes_per_claim_mean']:>12,.0f}{m['bytes_per_step'] / 1e6:>10.2f}"
            f"{m['driver_cpu_s_per_step_median']:>14.3f}{m['wall_s_per_step_median']:>9.3f}"
            f"{m['cells_task_s_per_step_median']:>9.3f}"
        )


if __name__ == "__main__":
    main()
