"""How fast this machine is at a cell's CPU share, measured once at a run's start.

A placement comparison holds only in its regime: the same config ran 230 s on one 2-core
machine and 143 s on another of the same kind, because training micro-steps cost a third as
much there and the run turned training-light (docs/measurements.md, "Regimes"). So every run
records what fixes its regime, and this module gives the part the run's own records cannot: a
fixed piece of training-shaped compute (forward and backward through an MLP of the tiny
model's width, in float32, on one torch thread like a cell), timed in a child process held to
the cell's CPU quota (``run.cell.cpu_quota``) when there is one, with the CPU's name, its
vector extensions and the load average around it. Two runs' numbers compare only when their
calibrations do.

The child is a separate process because a cgroup holds a whole process; it runs before the
cells start, so nothing of the run competes with it (other users of the machine may: the load
average says how much).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WIDTH, HIDDEN, LAYERS, TOKENS = 512, 2048, 2, 64
FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def flops_per_iteration() -> float:
    """Forward + backward (~3x the forward) of LAYERS blocks of two matmuls on TOKENS rows."""
    return 3.0 * LAYERS * 2 * (2.0 * TOKENS * WIDTH * HIDDEN)


def cpu_info(text: str) -> dict[str, Any]:
    """The CPU's model name and which of FLAGS it has, from ``/proc/cpuinfo``'s text."""
    name: str | None = None
    flags: set[str] = set()
    for line in text.splitlines():
        k, _, v = line.partition(":")
        k = k.strip()
        if k == "model name" and name is None:
            name = v.strip()
        elif k == "flags" and not flags:
            flags = set(v.split())
    return {"cpu_model": name, "cpu_flags": [f for f in FLAGS if f in flags]}


def summarize(iters: int, wall_s: float, cpu_s: float) -> dict[str, Any]:
    """Throughput over the whole window (a CFS quota throttles in 100 ms periods, so only a
    window of many periods measures the share; one iteration's time would not)."""
    per = wall_s / iters if iters else None
    return {
        "iterations": iters,
        "wall_s": round(wall_s, 3),
        "cpu_s": round(cpu_s, 3),
        "ms_per_iteration": None if per is None else round(per * 1e3, 2),
        "gflops": None if per is None else round(flops_per_iteration() / per / 1e9, 2),
        # CPU time per wall second: the share the quota (and the machine's other load) allowed
        "cpu_share": round(cpu_s / wall_s, 3) if wall_s > 0 else None,
    }


def _bench(seconds: float) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, WIDTH)]
    net = torch.nn.Sequential(*layers)
    x = torch.randn(TOKENS, WIDTH)
    for _ in range(2):  # warm-up: first-call allocation and kernel selection
        net(x).square().mean().backward()
    iters, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        net.zero_grad(set_to_none=True)
        net(x).square().mean().backward()
        iters += 1
    return summarize(iters, time.perf_counter() - t0, time.process_time() - c0)


def child(seconds: float, quota: float | None) -> dict[str, Any]:
    """Inside the child: confine itself to ``quota`` CPUs, then time the fixed compute."""
    if quota is not None:  # the group empties when this process exits; the cells' start sweeps it
        from gyre.runtime.cpulimit import confine

        confine(os.getpid(), quota)
    return _bench(seconds)


def calibrate(seconds: float, quota: float | None, timeout_s: float = 60.0) -> dict[str, Any]:
    """Run the child and return its timing with the CPU's description and the load average
    before and after; a failure is recorded (``error``), never raised: a run does not stop for
    its calibration."""
    try:
        cpu = cpu_info(Path("/proc/cpuinfo").read_text())
    except OSError:
        cpu = {"cpu_model": None, "cpu_flags": []}
    out: dict[str, Any] = {
        **cpu,
        "cpus": os.cpu_count(),
        "cpu_quota": quota,
        "load_before": round(os.getloadavg()[0], 2),
        "workload": f"fwd+bwd MLP {LAYERS}x({WIDTH}->{HIDDEN}->{WIDTH}), {TOKENS} tokens, "
        "fp32, 1 thread",
    }
    cmd = [sys.executable, "-m", "gyre.runtime.calibrate", str(seconds)]
    cmd += [] if quota is None else [str(quota)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        lines = p.stdout.strip().splitlines()
        if p.returncode != 0 or not lines:
            err = (p.stderr.strip().splitlines() or ["no output"])[-1]
            out["error"] = f"exit {p.returncode}: {err}"
        else:
            out.update(json.loads(lines[-1]))
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["load_after"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    q = float(sys.argv[2]) if len(sys.argv) > 2 else None
    print(json.dumps(child(float(sys.argv[1]), q)))
