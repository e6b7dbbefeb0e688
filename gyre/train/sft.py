"""A supervised warm-up on demonstrations: the optional start of an agent run (issue 34).

RL ranks the attempts of a group; when a base model almost never solves a task (SmolLM2-135M
gets 0 of 64 held-out ``calc`` problems right through the tool), the groups have nothing to
rank and learning has no signal. The usual remedy, and the one the peer comparison applies
to both sides identically, is a short supervised pass on demonstrations that a program
writes: here the family's oracle (:func:`gyre.harness.families.registry.demonstration`).

The demonstrations are rendered exactly as the rollout renders a request: the model
directory's own chat template (the shared tool-call template), the run's system prompt and
the tools the reference agent offers, so the warm-up teaches the token sequence the policy
later samples. Only the assistant's tokens are trained against (the template's
``{% generation %}`` markers, as TRL's ``assistant_only_loss``), the prompt, the worked
exchange and the tool's output are context.

The result is an ordinary model directory (weights, tokenizer, chat template) that
``model_dir`` of a run or a peer trainer points at, plus ``sft.json``: the settings and the
loss per step.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

IGNORE = -100  # label of a token that is context, not target


@dataclass(frozen=True)
class SftSettings:
    steps: int = 24
    batch_size: int = 8
    lr: float = 2e-5
    warmup_steps: int = 2  # linear warm-up, then cosine to 10 % of lr
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0


@dataclass
class SftResult:
    out_dir: str
    settings: dict[str, Any]
    demonstrations: int
    target_tokens: int  # assistant tokens trained against, over all demonstrations
    losses: list[float] = field(default_factory=list)  # mean target-token loss per step
    seconds: float = 0.0


def encode(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[list[int], list[int]]:
    """Token ids of one conversation and their labels (the id where the assistant wrote it,
    :data:`IGNORE` elsewhere). Refuses a template without ``{% generation %}`` markers: a
    warm-up that silently trained on the prompt would teach the model to write tool output."""
    out = tokenizer.apply_chat_template(
        messages,
        tools=tools,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids = list(out["input_ids"])
    mask = list(out.get("assistant_masks") or [])
    if len(mask) != len(ids) or not any(mask):
        raise ValueError(
            "the chat template marks no assistant tokens ({% generation %} ... "
            "{% endgeneration %}): install the shared tool template "
            "(python -m gyre.harness.families.toolproto MODEL_DIR OUT_DIR)"
        )
    return ids, [t if m else IGNORE for t, m in zip(ids, mask, strict=True)]


def lr_at(step: int, s: SftSettings) -> float:
    """Linear warm-up to ``lr``, then cosine down to a tenth of it at the last step."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    span = max(1, s.steps - s.warmup_steps - 1)
    frac = min(1.0, (step - s.warmup_steps) / span)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(
    model_dir: str | Path,
    conversations: Sequence[list[dict[str, Any]]],
    out_dir: str | Path,
    *,
    tools: list[dict[str, Any]] | None,
    settings: SftSettings = SftSettings(),
    progress: Callable[[int, float, float], None] | None = None,
) -> SftResult:
    """Fine-tune ``model_dir`` on ``conversations`` (full chat message lists, system prompt
    included) and write the result to ``out_dir``. ``progress(step, loss, lr)`` after each
    optimizer step."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gyre.train.checkpoint import write_hf

    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(model_dir)
    encoded = [encode(tok, m, tools) for m in conversations]
    if not encoded:
        raise ValueError("no demonstrations to train on")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    torch.manual_seed(settings.seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    rng = random.Random(settings.seed)
    order: list[int] = []
    result = SftResult(
        out_dir=str(out_dir),
        settings=asdict(settings),
        demonstrations=len(encoded),
        target_tokens=sum(sum(1 for x in lab if x != IGNORE) for _, lab in encoded),
    )
    for step in range(settings.steps):
        batch = []
        for _ in range(settings.batch_size):
            if not order:  # epochs in a fresh shuffled order each
                order = list(range(len(encoded)))
                rng.shuffle(order)
            batch.append(encoded[order.pop()])
        width = max(len(ids) for ids, _ in batch)
        ids_t = torch.full((len(batch), width), pad, dtype=torch.long)
        lab_t = torch.full((len(batch), width), IGNORE, dtype=torch.long)
        att_t = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (ids, lab) in enumerate(batch):
            ids_t[i, : len(ids)] = torch.tensor(ids)
            lab_t[i, : len(lab)] = torch.tensor(lab)
            att_t[i, : len(ids)] = 1
        lr = lr_at(step, settings)
        for g in opt.param_groups:
            g["lr"] = lr
        # mean over the batch's target tokens (HF shifts the labels)
        loss = model(input_ids=ids_t, attention_mask=att_t, labels=lab_t).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        opt.step()
        result.losses.append(float(loss.detach()))
        if progress is not None:
            progress(step, result.losses[-1], lr)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    write_hf(model, model_dir, out)
    result.seconds = round(time.monotonic() - t0, 1)
    (out / "sft.json").write_text(json.dumps(asdict(result), indent=1) + "\n", encoding="utf-8")
    return result
