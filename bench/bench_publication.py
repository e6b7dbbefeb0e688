"""Bytes and seconds per weight publication: disk, in memory (full), in memory (delta).

    OMP_NUM_THREADS=2 python bench/bench_publication.py              # tiny model + SmolLM2
    python bench/bench_publication.py --models tiny                  # tiny only (seconds)

For each model and learning rate: an embedded engine (in this process, its own thread and
loop, as in a cell) starts on the model; the trainer (a float32 copy) publishes version 0 in
memory (the base), takes ONE real AdamW step on a random batch at that lr, then publishes the
result three ways, each checked against the trainer's fingerprint:

- delta: ``DistributedWeightChannel`` over gloo, XOR-shuffle-zlib deltas with a CRC-32 per
  tensor (what is broadcast is the compressed payload);
- full: the same channel sending the tensors (SGLang's ``update_weights_from_distributed``);
- disk: ``write_hf`` then the engine's ``update_weights_from_disk`` (the baseline: what
  ``gyre run`` does today), bytes = the safetensors file.

Bytes are per engine (a broadcast reaches each). AdamW's first step moves every element by
about lr (its update is nearly sign(g)), so lr sets how many low bits of each float change.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from gyre.engine.checksum import weights_checksum
from gyre.engine.client import EngineClient
from gyre.engine.config import EmbeddedEngineConfig
from gyre.engine.service import EngineService
from gyre.train.checkpoint import write_hf
from gyre.train.weight_sync import DistributedWeightChannel
from gyre.train.weights import named_params

MODELS = {"tiny": "runs/tiny-model", "smollm2": "runs/smollm2"}


def one_step(model: torch.nn.Module, lr: float, seed: int = 0) -> None:
    """One AdamW step on a random batch (4 x 64 tokens), as the trainer's optimizer takes it."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.get_input_embeddings().weight.shape[0]
    ids = torch.randint(0, vocab, (4, 64), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.eval()


async def measure(model_dir: str, lr: float, tmp: Path) -> dict:
    svc = EngineService(
        EmbeddedEngineConfig(model_dir=model_dir, engine_id="bench", torch_threads=1)
    )
    url = await asyncio.to_thread(svc.start)
    trainer = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ch = DistributedWeightChannel([url])
    row: dict = {}
    try:
        async with EngineClient(url) as c:  # warm-up: the first reload pays one-off imports
            await c.update_weights_from_disk(model_dir, weight_version=0)
        await ch.connect()
        await ch.publish(0, named_params(trainer))
        one_step(trainer, lr)
        want, params = weights_checksum(trainer), named_params(trainer)
        delta = await ch.publish(1, params)
        assert delta.encoding != "raw" and delta.replies[0].weights_checksum == want
        ch.delta_ok = False
        full = await ch.publish(2, params)
        assert full.encoding == "raw" and full.replies[0].weights_checksum == want
        t0 = time.perf_counter()
        out = tmp / f"v3-{lr:g}"
        await asyncio.to_thread(write_hf, trainer, model_dir, out)
        t_save = time.perf_counter() - t0
        async with EngineClient(url) as c:
            r = await c.update_weights_from_disk(str(out), weight_version=3)
        t_disk = time.perf_counter() - t0
        assert r.weights_checksum == want
        row = dict(
            raw=delta.raw_bytes,
            disk_bytes=sum(f.stat().st_size for f in out.glob("*.safetensors")),
            disk_s=t_disk,
            save_s=t_save,
            full_bytes=full.payload_bytes,
            full_s=full.seconds,
            delta_bytes=delta.payload_bytes,
            delta_s=delta.seconds,
            delta_encode_s=delta.encode_s,
        )
    finally:
        await ch.close()
        await asyncio.to_thread(svc.stop)
    return row


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--lrs", nargs="+", type=float, default=[1e-5, 1e-2])
    args = ap.parse_args()
    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    head = (
        "| model | lr | tensors MiB | disk MiB | disk s | full MiB | full s | delta MiB | delta s "
        "(encode) | delta / full |"
    )
    print(head)
    print("|" + " --- |" * 10)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            if not (Path(MODELS[name]) / "config.json").exists():
                print(f"| {name} | - | missing {MODELS[name]} (gyre model tiny / get-smollm2.sh) |")
                continue
            for lr in args.lrs:
                r = asyncio.run(measure(MODELS[name], lr, Path(tmp)))
                print(
                    f"| {name} | {lr:g} | {_mb(r['raw'])} | {_mb(r['disk_bytes'])} | "
                    f"{r['disk_s']:.2f} | {_mb(r['full_bytes'])} | {r['full_s']:.2f} | "
                    f"{_mb(r['delta_bytes'])} | {r['delta_s']:.2f} ({r['delta_encode_s']:.2f}) | "
                    f"{r['delta_bytes'] / r['full_bytes']:.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
