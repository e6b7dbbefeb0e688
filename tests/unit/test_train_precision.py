"""bfloat16 compute in the trainer: the config, float32 masters, and log-probs close to float32."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError

from gyre.engine.config import EmbeddedEngineConfig
from gyre.trace.packing import PackedSequence
from gyre.train.config import OptimConfig, StreamConfig, TrainerConfig
from gyre.train.demo.coordinator import LocalCoordinator
from gyre.train.demo.core import Core
from gyre.train.demo.synthetic import synthetic_groups
from gyre.train.flops import ModelShape, causal_pairs, matmul_peak, mfu
from gyre.train.packed import plan_segments, token_logprobs
from gyre.train.precision import compute_autocast
from gyre.train.replica import load_causal_lm

# Stated bound: on the tiny model (hidden 64, random weights, 2048-token vocabulary) bf16 matmuls
# move a token's log-prob by ~1e-3 on average and a few 1e-3 at most (measured: max 4.5e-3, mean
# 1e-3 over 200 tokens); 2e-2 max / 5e-3 mean leaves room for other seeds while any real bug (a
# wrong cast, bf16 log-softmax, dropped residual) is far outside it.
MAX_ABS, MEAN_ABS = 2e-2, 5e-3


def test_compute_dtype_config_defaults_and_refusals(tiny_model_dir):
    assert TrainerConfig(model_dir="m").compute_dtype == "float32"
    assert TrainerConfig(model_dir="m", compute_dtype="bfloat16").compute_dtype == "bfloat16"
    assert EmbeddedEngineConfig(model_dir="m").compute_dtype == "float32"
    assert EmbeddedEngineConfig(model_dir="m", compute_dtype="bfloat16").compute_dtype == "bfloat16"
    for cls in (TrainerConfig, EmbeddedEngineConfig):
        with pytest.raises(ValidationError, match="compute_dtype"):
            cls(model_dir="m", compute_dtype="float16")
    with pytest.raises(ValueError, match="compute_dtype must be one of"):
        compute_autocast("cpu", "int8")


def _rows(n: int, seed: int) -> PackedSequence:
    g = torch.Generator().manual_seed(seed)
    return PackedSequence.from_chain(torch.randint(16, 2000, (n,), generator=g).tolist())


@pytest.mark.slow  # bf16 is emulated on AVX2-only cores: minutes under load
def test_bf16_logprobs_close_to_fp32_and_float32_out(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    seq = _rows(200, 0)
    with torch.no_grad():
        ref = token_logprobs(model, seq)
        with compute_autocast("cpu", "bfloat16"):
            low = token_logprobs(model, seq)
    assert low.dtype == torch.float32  # log-softmax taken in float32 under autocast
    d = (low - ref).abs()
    assert 0 < float(d.max()) < MAX_ABS, float(d.max())  # 0 would mean autocast did nothing
    assert float(d.mean()) < MEAN_ABS, float(d.mean())


def _cfg(model_dir, compute: str) -> TrainerConfig:
    return TrainerConfig(
        model_dir=str(model_dir),
        compute_dtype=compute,  # type: ignore[arg-type]
        optim=OptimConfig(name="adamw", lr=1e-3, grad_clip=None),
        stream=StreamConfig(batch_groups=2, token_budget=64, stall_timeout_s=20),
    )


def _step(cfg: TrainerConfig, groups, seen: list) -> tuple[Core, dict]:
    core = Core(cfg, LocalCoordinator(stall_timeout_s=20))
    core.start(resume=False)
    core.add_groups([copy.deepcopy(g) for g in groups])

    def look(_n: int) -> None:  # mid-accumulation: gradients live in param.grad
        seen.extend({p.grad.dtype for p in core.model.parameters() if p.grad is not None})

    core.run_step(on_microstep=look)
    return core, {n: p.detach().clone() for n, p in core.model.named_parameters()}


@pytest.mark.slow  # bf16 is emulated on AVX2-only cores: minutes under load
def test_bf16_step_keeps_float32_masters_grads_and_optimizer_state(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    groups = synthetic_groups(model, 2, 3, seed=1, context_len=(6, 12), target_len=(6, 12))
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    seen: list[torch.dtype] = []
    core, low = _step(_cfg(tiny_model_dir, "bfloat16"), groups, seen)
    assert seen and set(seen) == {torch.float32}
    assert {p.dtype for p in core.model.parameters()} == {torch.float32}
    states = [t for s in core.live_optimizer.state.values() for t in s.values()]
    assert states and {t.dtype for t in states if t.is_floating_point()} == {torch.float32}
    core.stop()
    _, ref = _step(_cfg(tiny_model_dir, "float32"), groups, [])
    # The bf16 step moves the weights like the float32 one (Adam's first step is ~lr*sign(g), so
    # the updates agree except where a gradient component is tiny enough for bf16 to flip it).
    moved = [float((ref[n] - init[n]).abs().max()) for n in ref]
    assert max(moved) > 1e-4
    agree = sum(
        int(torch.isclose(low[n] - init[n], ref[n] - init[n], atol=2e-4).sum()) for n in ref
    ) / sum(t.numel() for t in ref.values())
    assert agree > 0.9, agree
    assert any(not torch.equal(low[n], ref[n]) for n in ref)  # bf16 did change the arithmetic


def test_flops_count_and_mfu(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir))
    shape = ModelShape.of(model)
    lin = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert shape.body_params + shape.head_params == lin
    assert shape.head_params == model.config.vocab_size * model.config.hidden_size
    seq = _rows(64, 1)
    pairs = plan_segments(seq.parent).attention_pairs
    assert pairs == causal_pairs(0, 64) == 64 * 65 // 2
    fwd = shape.forward_flops(64, 63, pairs)
    assert fwd == 2 * shape.body_params * 64 + 2 * shape.head_params * 63 + 4 * shape.n_layers * (
        shape.attn_width * pairs
    )
    assert shape.train_flops(64, 63, pairs) == 3 * fwd
    assert mfu(1e9, 2.0, 1e9) == 0.5 and mfu(1.0, 0.0, 1e9) == 0.0
    peak = matmul_peak(torch.float32, n=128, threads=1, repeats=2)
    assert 1e6 < peak < 1e14
