"""The GSPO objective against hand-computed values and an independent float64 formula."""

import math

import pytest
import torch

from gyre.train.objective import gspo_loss


def _grad(logp_vals, b, ex, tw, adv, **kw):
    l = torch.tensor(logp_vals, dtype=torch.float64, requires_grad=True)
    loss, stats = gspo_loss(
        l,
        torch.tensor(b, dtype=torch.float64),
        torch.tensor(ex),
        torch.tensor(tw, dtype=torch.float64),
        torch.tensor(adv, dtype=torch.float64),
        **kw,
    )
    loss.backward()
    return float(loss.detach()), l.grad.tolist(), stats


def test_hand_computed_on_policy():
    # e0: A=+1, two tokens, l == b -> r = 1, s = 1: loss_e0 = -(1/2)(l0 + l1)
    # e1: A=-0.5, one token, l == b: loss_e1 = -(1)(-0.5) l2
    l = [math.log(0.5), math.log(0.25), math.log(0.8)]
    loss, g, st = _grad(l, l, [0, 0, 1], [0.5, 0.5, 1.0], [1.0, -0.5])
    assert loss == pytest.approx(
        -(0.5 * math.log(0.5) + 0.5 * math.log(0.25)) + 0.5 * math.log(0.8), abs=1e-12
    )
    assert g == pytest.approx([-0.5, -0.5, 0.5], abs=1e-12)
    assert st.tokens == 3 and st.tokens_capped == 0 and st.exec_clipped_weight == 0.0


def test_cap_bites():
    # token 0: l - b = log 10 -> r = 10 -> w = min(10, 5) = 5; token 1: l - b = -log 10 -> w = 0.1.
    # s_e = exp(mean(log 10, -log 10)) = 1: not clipped. A = 2.
    b = [math.log(0.05), math.log(0.5)]
    l = [math.log(0.5), math.log(0.05)]
    loss, g, st = _grad(l, b, [0, 0], [0.5, 0.5], [2.0])
    assert g == pytest.approx([-0.5 * 5 * 2, -0.5 * 0.1 * 2], rel=1e-9)
    assert loss == pytest.approx(-(0.5 * 5 * 2 * l[0] + 0.5 * 0.1 * 2 * l[1]), rel=1e-9)
    assert st.tokens_capped == 1
    # a larger cap lets the weight through
    _, g2, st2 = _grad(l, b, [0, 0], [0.5, 0.5], [2.0], token_cap=20.0)
    assert g2[0] == pytest.approx(-0.5 * 10 * 2, rel=1e-9) and st2.tokens_capped == 0


@pytest.mark.parametrize(
    "adv,delta,clipped",
    [
        (1.0, 0.006, True),  # A > 0, s = e^0.006 > 1.005: clipped
        (1.0, 0.004, False),  # A > 0, s = e^0.004 < 1.005
        (1.0, -0.5, False),  # A > 0, s << 1: the lower bound does not apply to positive advantages
        (-1.0, -0.006, True),  # A < 0, s = e^-0.006 < 0.995: clipped
        (-1.0, -0.004, False),
        (-1.0, 0.5, False),  # A < 0, s >> 1: not clipped
    ],
)
def test_sequence_clip_bites(adv, delta, clipped):
    # two tokens, each with l - b = delta -> log s_e = delta
    l = [math.log(0.3), math.log(0.6)]
    b = [x - delta for x in l]
    w = min(math.exp(delta), 5.0)
    _, g, st = _grad(l, b, [0, 0], [0.5, 0.5], [adv])
    if clipped:
        assert g == [0.0, 0.0] and st.exec_clipped_weight == pytest.approx(1.0)
    else:
        assert g == pytest.approx([-0.5 * w * adv] * 2, rel=1e-9) and st.exec_clipped_weight == 0.0


def _reference(l, b, ex, adv, cap, lo, hi):
    """The issue's formula written independently, execution by execution, in float64."""
    total = 0.0
    for e in range(len(adv)):
        idx = [i for i, x in enumerate(ex) if x == e]
        if not idx:
            continue
        s = torch.exp(sum(l[i].detach() - b[i] for i in idx) / len(idx))
        if (adv[e] > 0 and s > hi) or (adv[e] < 0 and s < lo):
            continue
        loss_e = 0.0
        for i in idx:
            w = min(float(torch.exp(l[i].detach() - b[i])), cap)
            loss_e = loss_e - w * adv[e] * l[i]
        total = total + loss_e / len(idx)
    return total


def test_matches_independent_float64_formula():
    g = torch.Generator().manual_seed(3)
    n, E = 40, 6
    ex = torch.randint(0, E, (n,), generator=g)
    ex[:E] = torch.arange(E)
    l0 = torch.log(torch.rand(n, generator=g, dtype=torch.float64) * 0.9 + 0.05)
    b = l0 + torch.randn(n, generator=g, dtype=torch.float64) * 0.01
    b[3] = l0[3] - 2.5  # r ~ 12: capped
    adv = torch.randn(E, generator=g, dtype=torch.float64)
    counts = torch.bincount(ex, minlength=E).to(torch.float64)
    tw = 1.0 / counts[ex]
    l = l0.clone().requires_grad_(True)
    loss, st = gspo_loss(l, b, ex, tw, adv)
    loss.backward()
    l2 = l0.clone().requires_grad_(True)
    ref = _reference(l2, b, ex.tolist(), adv.tolist(), 5.0, 0.995, 1.005)
    ref.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-12)
    assert torch.allclose(l.grad, l2.grad, rtol=1e-12, atol=1e-14)
    assert st.tokens_capped >= 1
    # at least one execution clipped and one not, so both branches are exercised
    assert 0 < st.exec_clipped_weight < E


def test_proximal_reference_is_on_policy():
    l = torch.tensor([math.log(0.5), math.log(0.1)], dtype=torch.float64, requires_grad=True)
    loss, st = gspo_loss(
        l,
        None,
        torch.tensor([0, 0]),
        torch.tensor([0.5, 0.5], dtype=torch.float64),
        torch.tensor([3.0], dtype=torch.float64),
    )
    loss.backward()
    assert l.grad.tolist() == pytest.approx([-1.5, -1.5]) and st.exec_clipped_weight == 0


def test_split_execution_needs_prepass_both_sides():
    """s_e from part of T_e is wrong; gspo_loss refuses it, and a pre-pass s_e gives the full answer."""
    g = torch.Generator().manual_seed(0)
    n = 10
    l0 = torch.log(torch.rand(n, generator=g, dtype=torch.float64) * 0.8 + 0.1)
    b = l0.clone()
    b[:5] -= 0.02  # first half: l - b = +0.02
    b[5:] += 0.019  # second half: l - b = -0.019 -> whole execution log s = 0.0005 (not clipped)
    ex = torch.zeros(n, dtype=torch.long)
    tw = torch.full((n,), 0.1, dtype=torch.float64)
    adv = torch.tensor([1.0], dtype=torch.float64)
    full = l0.clone().requires_grad_(True)
    gspo_loss(full, b, ex, tw, adv)[0].backward()
    # side 1: a micro-step with only the first half refuses to compute a local s_e
    part = l0[:5].clone().requires_grad_(True)
    with pytest.raises(ValueError, match="split across micro-steps"):
        gspo_loss(part, b[:5], ex[:5], tw[:5], adv)
    # ... and if it had (check disabled), the half's s_e = e^0.02 > 1.005 would clip it: a different gradient
    wrong = l0[:5].clone().requires_grad_(True)
    gspo_loss(wrong, b[:5], ex[:5], tw[:5], adv, check_complete=False)[0].backward()
    assert torch.all(wrong.grad == 0) and not torch.all(full.grad[:5] == 0)
    # side 2: with the pre-pass s_e the two halves reproduce the full gradient exactly
    log_s = ((l0 - b) * tw).sum().reshape(1)
    grads = []
    for sl in (slice(0, 5), slice(5, 10)):
        p = l0[sl].clone().requires_grad_(True)
        gspo_loss(p, b[sl], ex[sl], tw[sl], adv, seq_log_ratio=log_s)[0].backward()
        grads.append(p.grad)
    assert torch.allclose(torch.cat(grads), full.grad, rtol=0, atol=1e-15)
