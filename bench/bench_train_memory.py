"""A training cell's memory for one micro-step, with and without activation checkpointing.

    python bench/bench_train_memory.py --model runs/smollm2            # ~2-3 min on 2 cores
    python bench/bench_train_memory.py --model runs/smollm2 --tokens 2048 4096

Each configuration runs in a fresh process (so its peak RSS is its own): load the model as a
training replica does (``gyre.train.replica.load_causal_lm``), then the forward and backward
of one packed micro-step through ``gyre.train.packed.token_logprobs`` (Gyre's tree-attention
layer loop), the way a cell computes one: a chain of ``--tokens`` tokens whose last quarter
are targets (an agent's conversation: mostly context, the model's replies trained).
Reported per row: peak RSS once ready (weights paged in and one set of gradients, after a
16-token warm-up step), peak RSS after the micro-steps, what they added (activations and
what the backward keeps), and the forward+backward time (median of ``--repeats``).

Baseline: checkpointing off (``trainer.activation_checkpointing = false``, the default),
measured in the same run. What checkpointing trades: one more forward of compute for
keeping each layer's input only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

CHILD = r"""
import json, resource, sys, time
import torch
from gyre.trace.packing import PackedSequence
from gyre.train.packed import token_logprobs
from gyre.train.replica import load_causal_lm

model_dir, tokens, ckpt, repeats = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
torch.set_num_threads(int(sys.argv[5]))
rss = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MB
m = load_causal_lm(model_dir, checkpointing=ckpt)
g = torch.Generator().manual_seed(0)

def row(n):
    ids = torch.randint(100, m.config.vocab_size - 100, (n,), generator=g).tolist()
    return PackedSequence.from_chain(ids, [i >= n * 3 // 4 for i in range(n)])

def step(seq):
    m.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    token_logprobs(m, seq).sum().backward()
    return time.perf_counter() - t0

step(row(16))  # warm-up: the weights paged in, one set of gradients allocated
ready = rss()
seq = row(tokens)
times = [step(seq) for _ in range(repeats)]
print(json.dumps({"loaded_mb": ready, "peak_mb": rss(), "times": times}))
"""


def run_one(model: str, tokens: int, ckpt: bool, repeats: int, threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads)}
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            model,
            str(tokens),
            "1" if ckpt else "0",
            str(repeats),
            str(threads),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    if p.returncode != 0:
        raise SystemExit(
            f"bench_train_memory: the child failed: {p.stderr.strip().splitlines()[-1:]}"
        )
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="runs/smollm2", help="an HF model directory")
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096], help="micro-step sizes")
    ap.add_argument("--repeats", type=int, default=2, help="timed micro-steps")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    a = ap.parse_args(argv)
    if not (Path(a.model) / "config.json").is_file():
        print(f"bench_train_memory: {a.model} is not a model directory", file=sys.stderr)
        return 2
    from engine_roofline import cpu_model  # the benches' one reader of /proc/cpuinfo

    print(
        f"{cpu_model()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; model "
        f"{a.model}, {a.threads} torch threads, float32"
    )
    hdr = f"{'tokens':>7}  {'checkpointing':<14}{'ready MB':>10}{'peak MB':>9}{'step added MB':>14}{'fwd+bwd s':>10}{'vs baseline':>12}"
    print(hdr)
    print("-" * len(hdr))
    for n in a.tokens:
        base = None
        for ckpt in (False, True):
            r = run_one(a.model, n, ckpt, a.repeats, a.threads)
            added = r["peak_mb"] - r["loaded_mb"]
            t = statistics.median(r["times"])
            if base is None:
                base = (added, t)
                ratio = "baseline"
            else:
                ratio = f"{added / base[0]:.2f}x mem, {t / base[1]:.2f}x time"
            print(
                f"{n:>7}  {('on' if ckpt else 'off (default)'):<14}{r['loaded_mb']:>10.0f}"
                f"{r['peak_mb']:>9.0f}{added:>14.0f}{t:>10.2f}  {ratio}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
