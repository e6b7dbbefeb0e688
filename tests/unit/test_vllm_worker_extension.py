"""Gyre's vLLM worker extension (gyre/engine/vllm_plugin/gyre_vllm_worker.py) without vLLM.

The stand-ins copy the one behaviour that matters, from vLLM 0.32's CPU path: an embedding's
``process_weights_after_loading`` packs a *copy* of the weight that the logits GEMM uses, and
tying makes the head share the embedding's ``Parameter``. The real server is tested in
tests/integration/test_engine_vllm_tied.py.
"""

from __future__ import annotations

import torch

from gyre.engine.vllm_launch import PLUGIN_DIR, WORKER_EXTENSION, vllm_command, vllm_env
from gyre.engine.vllm_plugin.gyre_vllm_worker import (
    GyreWorkerExtension,
    refresh_tied_heads,
    tied_heads,
)


class PackingMethod:
    """Like vLLM's UnquantizedEmbeddingMethod on CPU: logits come from a packed copy."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        layer.packed = layer.weight.detach().clone()


class VocabParallelEmbedding(torch.nn.Module):
    def __init__(self, n: int = 8, d: int = 4) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n, d), requires_grad=False)
        self.quant_method = PackingMethod()
        self.quant_method.process_weights_after_loading(self)


class ParallelLMHead(VocabParallelEmbedding):
    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.packed.T


class Model(torch.nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding()
        self.lm_head = ParallelLMHead()
        if tied:
            self.lm_head.weight = self.embed_tokens.weight
        self.lm_head.quant_method.process_weights_after_loading(self.lm_head)


def reload_in_place(model: Model, new: torch.Tensor) -> None:
    """What vLLM's layerwise reload does for a tied checkpoint: the embedding's values are
    copied into the shared Parameter and it is re-processed; the head is not."""
    model.embed_tokens.weight.data.copy_(new)
    model.embed_tokens.quant_method.process_weights_after_loading(model.embed_tokens)


def test_tied_head_is_found_and_refreshed():
    m = Model(tied=True)
    assert tied_heads(m) == [m.lm_head]
    h = torch.randn(3, 4)
    new = torch.randn(8, 4)
    reload_in_place(m, new)
    assert not torch.equal(m.lm_head.logits(h), h @ new.T)  # stale: the bug
    assert refresh_tied_heads(m) == 1
    assert torch.equal(m.lm_head.logits(h), h @ new.T)


def test_untied_head_is_left_alone():
    m = Model(tied=False)
    packed = m.lm_head.packed
    assert tied_heads(m) == [] and refresh_tied_heads(m) == 0
    assert m.lm_head.packed is packed


def test_extension_methods_reload_then_refresh():
    calls: list[str] = []
    m = Model(tied=True)
    new = torch.randn(8, 4)

    class Runner:
        def get_model(self) -> Model:
            return m

    class Worker(GyreWorkerExtension):
        model_runner = Runner()

        def reload_weights(self, weights_path: str) -> None:
            calls.append(weights_path)
            reload_in_place(m, new)

    w = Worker()
    assert w.gyre_tied_heads() == 1 and calls == []
    assert w.gyre_reload_weights("/pub/v3") == 1 and calls == ["/pub/v3"]
    assert torch.equal(m.lm_head.packed, new)


def test_extension_adds_only_gyre_names():
    """vLLM refuses an extension defining a name its worker already has."""
    names = [a for a in dir(GyreWorkerExtension) if not a.startswith("__")]
    assert names and all(a.startswith("gyre_") for a in names)


def test_launch_passes_the_extension_and_only_its_directory():
    cmd = vllm_command("py", "/m", "127.0.0.1", 1)
    assert cmd[cmd.index("--worker-extension-cls") + 1] == WORKER_EXTENSION
    env = vllm_env(base={"PYTHONPATH": "/work/gyre", "PATH": "/bin"})
    assert env["PYTHONPATH"] == str(PLUGIN_DIR)
    assert sorted(p.name for p in PLUGIN_DIR.glob("*.py")) == ["gyre_vllm_worker.py"]
