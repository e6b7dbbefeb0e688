"""Synthetic ready groups for tests and benchmarks (named as such: not rollouts).

Each execution is one packed row: random context tokens followed by random target
tokens whose behaviour log-probs are the given model's own log-probs plus small
Gaussian noise, so sequence ratios sit near 1 and the clip bites on a few
executions, as with a slightly stale policy. Deterministic for a seed.
"""

from __future__ import annotations

import random

import torch

from gyre.trace.packing import PackedSequence
from gyre.train.buffer import ReadyGroup
from gyre.train.rewards import Reward


def chain_row(
    context: list[int], targets: list[int], behaviour: list[float], version: int = 0
) -> PackedSequence:
    ids = list(context) + list(targets)
    n, nc = len(ids), len(context)
    tgt = [i >= nc for i in range(n)]
    return PackedSequence(
        input_ids=ids,
        position_ids=list(range(n)),
        parent=[i - 1 for i in range(n)],
        is_target=tgt,
        behaviour_logprob=[0.0] * nc + list(behaviour),
        policy_version=[-1] * nc + [version] * len(targets),
        execution_index=[-1] * nc + [0] * len(targets),
        token_weight=[0.0] * nc + [1.0 / len(targets)] * len(targets),
    )


def _deal(row: PackedSequence, nc: int, branches: int) -> list[PackedSequence]:
    n_t = len(row.input_ids) - nc
    out = []
    for k in range(branches):
        keep = {nc + i for i in range(k, n_t, branches)}
        if not keep:
            continue
        n = len(row.input_ids)
        out.append(
            PackedSequence(
                input_ids=list(row.input_ids),
                position_ids=list(row.position_ids),
                parent=list(row.parent),
                is_target=[i in keep for i in range(n)],
                behaviour_logprob=[
                    row.behaviour_logprob[i] if i in keep else 0.0 for i in range(n)
                ],
                policy_version=[row.policy_version[i] if i in keep else -1 for i in range(n)],
                execution_index=[0 if i in keep else -1 for i in range(n)],
                token_weight=[1.0 / n_t if i in keep else 0.0 for i in range(n)],
            )
        )
    return out


def synthetic_groups(
    model,
    n_groups: int,
    group_size: int,
    *,
    seed: int = 0,
    context_len: tuple[int, int] = (8, 24),
    target_len: tuple[int, int] = (8, 24),
    noise: float = 0.02,
    vocab: int | None = None,
    missing_every: int = 0,
    prefix: str = "g",
    branches: int = 1,
) -> list[ReadyGroup]:
    """``n_groups`` groups of ``group_size`` executions with 0/1-ish rewards.

    With ``branches > 1`` an execution is that many copies of its row with its targets
    dealt round-robin among them (a disjoint T_e, as admission produces), so large
    executions spread over several micro-steps and exercise the s_e pre-pass.
    """
    from gyre.train.packed import token_logprobs

    rng = random.Random(seed)
    V = vocab or model.config.vocab_size
    groups = []
    for g in range(n_groups):
        rewards: dict[str, Reward] = {}
        rows: dict[str, list[PackedSequence]] = {}
        for e in range(group_size):
            eid = f"{prefix}{g}/e{e}"
            ctx = [rng.randrange(10, V) for _ in range(rng.randint(*context_len))]
            tg = [rng.randrange(10, V) for _ in range(rng.randint(*target_len))]
            row = chain_row(ctx, tg, [0.0] * len(tg), version=g % 3)
            with torch.no_grad():
                lp = token_logprobs(model, row)
            nc = len(ctx)
            row.behaviour_logprob = [0.0] * nc + [
                float(lp[nc + i]) + rng.gauss(0.0, noise) for i in range(len(tg))
            ]
            rows[eid] = [row] if branches <= 1 else _deal(row, nc, branches)
            rewards[eid] = float(rng.random() < 0.5) + 0.1 * rng.random()
        if missing_every and g % missing_every == 0:
            from gyre.trace.assessment import Missing, MissingReason

            rewards[f"{prefix}{g}/e0"] = Missing(
                reason=MissingReason.evaluator_error, detail="synthetic evaluator crash"
            )
        groups.append(ReadyGroup(group_id=f"{prefix}{g}", rewards=rewards, rows=rows))
    return groups
