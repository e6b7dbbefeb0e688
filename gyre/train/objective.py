r"""The training objective: GSPO with capped token weights and a per-execution clip.

The paper says only "GSPO with token-level importance weights capped at 5 and a
sequence-level clip of [0.995, 1.005] applied per execution". Gyre adopts this
reading (sg = stop-gradient):

* ``b_t``: reference log-prob of target token t: the behaviour log-prob recorded
  by the proxy from the engine that sampled it (default), or the *proximal*
  log-prob of the step's starting weights;
* ``l_t``: the current policy's log-prob of t (with grad);
* ``r_t = exp(l_t - b_t)``; token weight ``w_t = min(sg(r_t), C)`` with ``C = 5``;
* ``s_e = exp( (1/|T_e|) * sum_{t in T_e} (l_t - b_t) )``, execution e's sequence ratio;
* clip mask ``m_e = 0`` if (A_e > 0 and s_e > 1.005) or (A_e < 0 and s_e < 0.995), else 1
  (what GSPO's min(s A, clip(s) A) does to the gradient);
* ``loss_e = -(m_e / |T_e|) * sum_{t in T_e} w_t * A_e * l_t``;
* batch loss ``L = (1/E) * sum_e loss_e`` over the batch's E scored executions.

T_e is the execution's admitted (disjoint) target set; ``1/|T_e|`` arrives per token
as ``PackedSequence.token_weight``, so a branchy execution weighs as much as a
straight one. Gradient flows only through ``l_t`` (``w_t`` and ``m_e`` are
constants), so ``s_e`` may come from a no-grad pre-pass when T_e spans several
micro-steps.

With ``ratio_reference="proximal"`` the reference is the log-prob under the step's
starting weights. Weights do not change during gradient accumulation and each
batch gets exactly one optimizer step, so the proximal log-prob equals ``sg(l_t)``
at the moment it is computed: no extra forward is needed, r_t = s_e = 1 and the
objective reduces to an on-policy policy gradient weighted per execution.

With ``ratio_reference="decoupled"`` (AReaL's decoupled PPO, one optimizer step per
batch) the two roles of the reference are split: ``w_t`` stays the capped behaviour ratio,
which corrects for the batch having been sampled by older weights, while the sequence
clip is measured against the proximal policy, so ``s_e = 1`` and no execution is clipped.
The paper's band bounds how far one step moves the policy from the one it is measured
against; against the behaviour policy a stale execution is outside the band before the
step starts (one version of staleness at lr 1e-5 on a 135M model moves ``s_e`` past
1.005), and the clip then removes the signal of the executions the policy already
learned from (docs/training.md, "The objective").

Micro-steps return the *sum* ``sum_e loss_e`` of their tokens; the 1/E factor is
applied once to the reduced gradient, because under streaming E is known only
when the batch's last group has landed. The gradient is linear in the per-token
terms, so any split of the tokens into micro-steps sums to the same gradient.
"""

from __future__ import annotations

import math

import torch

from gyre.trace.packing import ACCUMULATED_WEIGHT_SUM_TOL, weights_sum_to_one
from gyre.train.stats import N_SUM, TURN_BUCKETS, ObjectiveStats

__all__ = [
    "N_SUM",
    "ObjectiveStats",
    "execution_log_ratio",
    "gspo_loss",
    "mismatch_stats",
]


def mismatch_stats(
    logp: torch.Tensor,
    behaviour: torch.Tensor,
    token_version: torch.Tensor,
    trainer_version: int | None,
    turn: torch.Tensor | None = None,
) -> ObjectiveStats:
    """The train/inference mismatch of some targets, as the ``mm_*`` fields of ObjectiveStats.

    ``d = l - b`` per target; targets with ``token_version < 0`` carry no behaviour log-prob
    and are left out. The KL estimate is NeMo-RL's ``gen_kl_error`` (the k3 estimator of
    KL(pi_gen || pi_train) with tokens sampled from pi_gen: ``exp(d) - d - 1``, >= 0, zero
    iff ``l == b``); ``token_mult_prob_error`` is NeMo-RL's mean of ``exp(|d|)`` (1 when the
    two agree). ``trainer_version=None`` (unknown) counts every target as other-version.
    ``turn``: each target's model call in its execution (1-based; <= 0 unknown): the
    same-version targets' count and k3 sum are also kept per bucket of calls (TURN_BUCKETS),
    because a mismatch that grows with the context shows there first.
    """
    d_all = logp.detach().to(torch.float64) - behaviour.detach().to(torch.float64)
    ver = token_version.to(d_all.device)
    out = ObjectiveStats()
    if trainer_version is None:
        same = torch.zeros_like(ver, dtype=torch.bool)
    else:
        same = ver == trainer_version
    for name, mask in (("same", same & (ver >= 0)), ("other", ~same & (ver >= 0))):
        d = d_all[mask]
        if d.numel() == 0:
            continue
        setattr(out, f"mm_{name}_tokens", int(d.numel()))
        setattr(out, f"mm_{name}_k3", float((torch.expm1(d) - d).sum()))
        setattr(out, f"mm_{name}_mult", float(torch.exp(d.abs()).sum()))
        setattr(out, f"mm_{name}_max", float(d.abs().max()))
    if turn is not None and trainer_version is not None:
        t = turn.to(d_all.device)
        known = same & (ver >= 0) & (t > 0)
        # bucket = ceil(log2 t), the last bucket open-ended: 1, 2, 3-4, 5-8, ..., 33+
        bucket = sum((t > b).long() for b in (1, 2, 4, 8, 16, 32))
        for i, label in enumerate(TURN_BUCKETS):
            d = d_all[known & (bucket == i)]
            if d.numel():
                setattr(out, f"mm_turn{label}_tokens", int(d.numel()))
                setattr(out, f"mm_turn{label}_k3", float((torch.expm1(d) - d).sum()))
    return out


def execution_log_ratio(
    diff: torch.Tensor, exec_index: torch.Tensor, token_weight: torch.Tensor, n_exec: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-execution sum of ``token_weight * (l - b)`` and of ``token_weight`` (no grad).

    With token_weight = 1/|T_e| and all of T_e present, the first is log s_e and the
    second is 1.
    """
    d = diff.detach().to(torch.float64)
    w = token_weight.detach().to(torch.float64)
    num = torch.zeros(n_exec, dtype=torch.float64, device=d.device).index_add_(0, exec_index, w * d)
    den = torch.zeros(n_exec, dtype=torch.float64, device=d.device).index_add_(0, exec_index, w)
    return num, den


def gspo_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor | None,
    exec_index: torch.Tensor,
    token_weight: torch.Tensor,
    advantages: torch.Tensor,
    *,
    token_cap: float = 5.0,
    clip_low: float = 0.995,
    clip_high: float = 1.005,
    seq_log_ratio: torch.Tensor | None = None,
    check_complete: bool = True,
    token_weight_exact: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ObjectiveStats]:
    """Sum over executions of ``loss_e`` for the target tokens given (see module docstring).

    Args:
        logp: ``l_t`` for N target tokens (with grad).
        ref_logp: reference log-probs ``b_t`` (N); ``None`` means proximal (``sg(l_t)``).
        exec_index: execution of each token, in ``[0, E)``.
        token_weight: ``1/|T_e|`` per token.
        advantages: ``A_e`` per execution (E).
        seq_log_ratio: per-execution ``log s_e`` from a pre-pass; when ``None`` it is
            computed from these tokens, which must then hold all of each T_e.
        check_complete: with ``seq_log_ratio=None``, raise if an execution's token
            weights do not sum to 1 (its T_e is split, so a local s_e would be wrong).
        token_weight_exact: float64 token weights for s_e and the counters when
            ``token_weight`` was cast to a lower precision.
    Returns:
        (loss, stats): ``loss`` is the sum of ``loss_e``; backprop it and divide the
        gradient by E at the end of the batch.
    """
    n_exec = int(advantages.numel())
    ref = logp.detach() if ref_logp is None else ref_logp.to(logp.dtype)
    diff = logp - ref
    if seq_log_ratio is None:
        num, den = execution_log_ratio(
            diff,
            exec_index,
            token_weight if token_weight_exact is None else token_weight_exact,
            n_exec,
        )
        present = den > 0
        if check_complete and bool(present.any()):
            bad = [
                i
                for i, d in enumerate(den.tolist())
                if d > 0 and not weights_sum_to_one(d, ACCUMULATED_WEIGHT_SUM_TOL)
            ]
            if bad:
                i = bad[0]
                raise ValueError(
                    f"execution #{i} has token weights summing to {float(den[i]):.6f} != 1 in this micro-step: "
                    "its target set is split across micro-steps, so s_e needs a pre-pass "
                    "(objective.execution_split='prepass')"
                )
        log_s = num
    else:
        log_s = seq_log_ratio.to(torch.float64)
    adv64 = advantages.to(torch.float64)
    clipped = ((adv64 > 0) & (log_s > math.log(clip_high))) | (
        (adv64 < 0) & (log_s < math.log(clip_low))
    )
    keep = (~clipped).to(logp.dtype)
    r = torch.exp(diff.detach())
    w = torch.clamp(r, max=token_cap)
    coef = (
        keep[exec_index] * token_weight.to(logp.dtype) * w * advantages.to(logp.dtype)[exec_index]
    )
    loss = -(coef * logp).sum()
    tw = token_weight.detach().to(torch.float64)
    if token_weight_exact is not None:
        tw = token_weight_exact.detach().to(torch.float64)
    stats = ObjectiveStats(
        loss_sum=float(loss.detach()),
        tokens=int(logp.numel()),
        tokens_capped=int((r > token_cap).sum()),
        exec_weight=float(tw.sum()),
        exec_clipped_weight=float((tw * clipped[exec_index].to(torch.float64)).sum()),
    )
    return loss, stats
