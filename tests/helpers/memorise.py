"""Teach the tiny random model a few exact continuations (test-only).

A randomly initialised model never writes a ``<tool_call>``, so a tool-call conversation
through a real engine (vLLM) needs a model that does. This fits the tiny model to given
(prompt ids, output ids) pairs until greedy decoding reproduces every output token with a
clear margin, then saves it as an ordinary Hugging Face directory that any engine loads.
Seconds on CPU: the model has ~0.6M parameters and the pairs are a few hundred tokens.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def memorise(
    base_dir: str | Path,
    out_dir: str | Path,
    pairs: list[tuple[list[int], list[int]]],
    *,
    margin: float = 3.0,
    max_steps: int = 400,
    lr: float = 1e-2,
    seed: int = 0,
    untie: bool = False,
) -> int:
    """Fit the model in ``base_dir`` to ``pairs`` and save it to ``out_dir``; returns the steps
    taken. ``untie``: save ``lm_head`` as its own tensor (see :func:`untied_copy`). Raises RuntimeError when greedy decoding does not reproduce every pair with a logit
    margin of at least ``margin`` within ``max_steps``."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    torch.set_num_threads(1)  # a 0.6M-parameter model: more threads only contend on 2 cores
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    # A conversation's calls nest (call k+1's prompt starts with call k's prompt + output), so
    # one forward over the longest sequence trains every output; else one sequence per pair.
    groups: list[tuple[list[int], list[int]]] = []  # (ids, positions predicting a target)
    for p, o in sorted(pairs, key=lambda x: -len(x[0]) - len(x[1])):
        full = p + o
        pos = list(range(len(p) - 1, len(full) - 1))
        for ids, where in groups:
            if ids[: len(full)] == full:
                where.extend(pos)
                break
        else:
            groups.append((full, pos))
    seqs = [(torch.tensor([ids]), torch.tensor(pos)) for ids, pos in groups]

    def fitted() -> bool:
        model.eval()
        with torch.no_grad():
            for ids, pos in seqs:
                logits = model(ids).logits[0, pos]
                top2 = logits.topk(2, dim=-1)
                if not bool((top2.indices[:, 0] == ids[0, pos + 1]).all()):
                    return False
                if float((top2.values[:, 0] - top2.values[:, 1]).min()) < margin:
                    return False
        model.train()
        return True

    step = 0
    for step in range(1, max_steps + 1):
        opt.zero_grad()
        loss = torch.zeros(())
        for ids, pos in seqs:
            logits = model(ids).logits[0, pos]
            loss = loss + torch.nn.functional.cross_entropy(logits, ids[0, pos + 1])
        loss.backward()
        opt.step()
        if step % 10 == 0 and fitted():
            break
    else:
        raise RuntimeError(f"the tiny model did not memorise {len(pairs)} pairs in {max_steps}")
    if untie:
        _untie(model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for f in Path(base_dir).iterdir():  # tokenizer and template files
        if f.is_file() and not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return step


def _untie(model) -> None:
    import torch

    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
        emb = model.get_input_embeddings().weight
        model.lm_head.weight = torch.nn.Parameter(emb.detach().clone())


def untied_copy(model_dir: str | Path, out_dir: str | Path) -> Path:
    """The same model with ``lm_head`` stored apart from the embeddings. An untied model is
    reloaded by vLLM's own ``reload_weights`` (a tied one goes through Gyre's worker extension,
    which re-packs the head vLLM's reload leaves stale), so test_engine_vllm's reload test
    uses untied models to cover that plain path."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    _untie(model)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for f in Path(model_dir).iterdir():
        if f.is_file() and not (out / f.name).exists():
            shutil.copy(f, out / f.name)
    return out
