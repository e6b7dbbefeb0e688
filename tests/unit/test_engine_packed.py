"""Linear layers on oneDNN-packed weights (gyre.engine.packed) compute what ``nn.Linear`` does,
keep the same parameters, and serve new weights only once repacked."""

from __future__ import annotations

import pytest
import torch

from gyre.engine.packed import PackedLinear, available, pack_linears, repack, unpack

pytestmark = pytest.mark.skipif(not available(), reason="no oneDNN in this torch build")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 96, bias=False), torch.nn.SiLU(), torch.nn.Linear(96, 32)
    )


@pytest.mark.parametrize("rows", [1, 5, 16, 40])
def test_packed_linears_match_nn_linear_and_keep_the_state_dict(rows):
    model = _model()
    x = torch.randn(2, rows, 64)
    with torch.inference_mode():
        want = model(x)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        assert pack_linears(model, 16) == 2
        assert all(type(m) is PackedLinear for m in (model[0], model[2]))
        got = model(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    unpack(model)
    assert type(model[0]) is torch.nn.Linear


def test_a_weight_change_is_served_only_after_repack():
    model = _model()
    x = torch.randn(3, 64)
    with torch.inference_mode():
        pack_linears(model, 8)
        old = model(x)
        for name, p in model.named_parameters():
            if name.endswith("weight"):  # a bias is read as it is; a weight only once packed
                p.mul_(2.0)  # in place, as a reload or a received bucket writes
        stale = model(x)
        repack(model, 8)
        new = model(x)
        model[0]._packed = None  # the plain nn.Linear path on the same weights
        model[2]._packed = None
        plain = model(x)
    torch.testing.assert_close(stale, old)  # the packed copy is a copy: repack is what serves
    torch.testing.assert_close(new, plain, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(new, old)


def test_gradients_take_the_nn_linear_path():
    model = _model()
    pack_linears(model, 8)
    x = torch.randn(4, 64)
    model(x).sum().backward()  # the packed op has no backward: training must not reach it
    assert model[0].weight.grad is not None


@pytest.mark.skipif(not available(torch.bfloat16), reason="no oneDNN bfloat16 here")
def test_bf16_weights_under_autocast_match_autocast_linear():
    model = _model()
    for m in (model[0], model[2]):
        m.weight = torch.nn.Parameter(m.weight.detach().bfloat16(), requires_grad=False)
        m.bias = None if m.bias is None else torch.nn.Parameter(m.bias.detach().bfloat16())
    x = torch.randn(16, 64)
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
        pack_linears(model, 16)
        got = model(x)
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
