"""One rank of a 2-cell x 2-rank sharded run (test_train_fsdp_cells.py starts 4 of these), and the
one-process reference it is compared with.

Every rank builds the same batches from a seed. A batch is 4 micro-steps of 4 executions
(equal-length token rows, a random advantage each). The loss is the repo's objective
(``gspo_loss`` with the proximal reference: per execution, token weights 1/|T_e|), summed
per micro-step; the reduced gradient is divided by E = 16 once, clipped, and AdamW steps
(gyre.train.step.optimizer_step's order). Inside a cell, rank ``l`` takes executions
``l::G`` of each micro-step the cell claimed.

Each scenario starts from the model's initial weights (loaded into the shards with
``load_full_state``) and a fresh optimizer on the core; it is a list of steps
``(batch seed, core micro-steps, k)``, cell 1 doing the rest. Rank 0 and rank 2 (cell 1's
first rank) save their cell's full weights and the core's gradient norms per scenario.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from gyre.train.fsdp import (
    CellLayout,
    finish_step,
    full_state_dict,
    init_sharded_process,
    load_full_state,
    shard_model,
)
from gyre.train.objective import gspo_loss

LAYOUT = CellLayout(cells=2, per_cell=2)
DEVICE = os.environ.get(
    "GYRE_FSDP_DEVICE", "cpu"
)  # cuda: scripts/gpu-check.sh (NCCL, a GPU a rank)
MICRO, PER_MICRO, LENGTH = 4, 4, 12
E = MICRO * PER_MICRO
LR, GRAD_CLIP = 1e-3, 1.0
BATCHES = {"A": 1, "B": 2}

# name -> steps (batch, core micro-steps, participating cells k)
SCENARIOS: dict[str, list[tuple[str, int, int]]] = {
    "4+0_k1": [("A", 4, 1)],
    "4+0_k2": [("A", 4, 2)],  # cell 1 joined but claimed nothing: it sends zeros
    "3+1": [("A", 3, 2)],
    "2+2": [("A", 2, 2)],
    "1+3": [("A", 1, 2)],
    "0+4": [("A", 0, 2)],  # the core claimed nothing (claim_microsteps allows it)
    # cell 1 misses step 1, loads the core's snapshot, joins step 2 with the same groups
    "rejoin": [("A", 4, 1), ("B", 2, 2)],
}


def batch(name: str, vocab: int) -> list[list[tuple[torch.Tensor, float]]]:
    """MICRO micro-steps of PER_MICRO executions: (token row, advantage)."""
    g = torch.Generator().manual_seed(BATCHES[name])
    return [
        [
            (
                torch.randint(0, vocab, (LENGTH,), generator=g),
                float(torch.randn((), generator=g, dtype=torch.float64)),
            )
            for _ in range(PER_MICRO)
        ]
        for _ in range(MICRO)
    ]


def micro_loss(model: torch.nn.Module, execs: list[tuple[torch.Tensor, float]]) -> torch.Tensor:
    """Sum over the executions of their GSPO loss (one forward for all of them)."""
    tokens = torch.stack([t for t, _ in execs]).to(DEVICE)
    logits = model(input_ids=tokens).logits[:, :-1]
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]
    n, t = logp.shape
    loss, _ = gspo_loss(
        logp.reshape(-1),
        None,
        torch.arange(n, device=logp.device).repeat_interleave(t),
        torch.full((n * t,), 1.0 / t, dtype=logp.dtype, device=logp.device),
        torch.tensor([a for _, a in execs], dtype=torch.float64, device=logp.device),
    )
    return loss


def load_model(model_dir: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)


def optimizer(params) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


def reference(model_dir: str, steps: list[str]) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process, one whole replica, the whole batch per step: weights and grad norms."""
    model = load_model(model_dir)
    opt = optimizer(model.parameters())
    vocab = model.config.vocab_size
    norms = []
    for name in steps:
        for micro in batch(name, vocab):
            micro_loss(model, micro).backward()
        for p in model.parameters():
            p.grad.div_(E)
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)))
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in model.named_parameters()}, norms


def run_rank(rank: int, port: int, model_dir: str, out: Path) -> None:
    cuda = DEVICE == "cuda"
    groups = init_sharded_process(
        LAYOUT,
        rank,
        port,
        backend="nccl" if cuda else "gloo",
        device_type=DEVICE,
        device_index=rank % torch.cuda.device_count() if cuda else None,
        timeout_s=120,
    )
    model = load_model(model_dir)
    vocab = model.config.vocab_size
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    shard_model(model, groups)
    G, cell, local = LAYOUT.per_cell, groups.cell, groups.local
    for scenario, steps in SCENARIOS.items():
        load_full_state(model, init)
        opt = optimizer(model.parameters()) if cell == 0 else None
        norms = []
        for i, (name, core_n, k) in enumerate(steps):
            if i > 0 and k > steps[i - 1][2]:
                # cells that missed the last step load the core's published snapshot
                path = out / f"{scenario}_snapshot{i}.pt"
                if cell == 0:
                    snap = full_state_dict(model)
                    if rank == 0:
                        torch.save(snap, path)
                dist_barrier()
                if steps[i - 1][2] <= cell < k:
                    load_full_state(model, torch.load(path))
            micro = batch(name, vocab)
            mine = micro[:core_n] if cell == 0 else micro[core_n:] if cell < k else []
            for execs in mine:
                micro_loss(model, execs[local::G]).backward()
            if cell < k:
                norms.append(finish_step(model, groups, k, opt, n_scored=E, grad_clip=GRAD_CLIP))
        final = {n: t.cpu() for n, t in full_state_dict(model).items()}
        if local == 0:
            torch.save(final, out / f"{scenario}_cell{cell}.pt")
        if rank == 0:
            (out / f"{scenario}_norms.json").write_text(json.dumps(norms))
        dist_barrier()


def dist_barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    run_rank(a.rank, a.port, a.model, Path(a.out))
    import torch.distributed as dist

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
