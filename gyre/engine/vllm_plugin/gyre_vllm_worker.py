"""Gyre's vLLM worker extension: an in-place weight reload that also refreshes a tied head.

This file runs inside vLLM's own venv (``gyre.engine.vllm_launch`` puts this directory on the
server's ``PYTHONPATH`` and passes ``--worker-extension-cls
gyre_vllm_worker.GyreWorkerExtension``; vLLM mixes the class into its worker, so its methods
are callable through ``/collective_rpc``). It imports nothing: neither Gyre (whose packages
are not in that venv) nor vLLM (so Gyre's CI can test it with stand-in modules).

Why it exists. With ``tie_word_embeddings`` vLLM builds ``lm_head`` (a ``ParallelLMHead``)
sharing one ``Parameter`` with ``embed_tokens``. On CPU, loading runs each layer's
``quant_method.process_weights_after_loading``, and for an embedding/head that is
``dispatch_cpu_unquantized_gemm``: the logits GEMM gets a *packed copy* of the weight
(oneDNN handle or sgl packed weight) in ``layer.cpu_linear``. vLLM 0.32's in-place reload
(``reload_weights``, layerwise) reloads every layer the checkpoint names; a tied checkpoint
names no ``lm_head.weight``, so the head is not processed again ("ParallelLMHead: Failed to
load weights"): its shared ``weight`` holds the new values (``embed_tokens`` copied them in)
but its packed copy, which computes the logits, is still the old one. Log-probs after such a
reload were measured 0.07 off the new weights. Re-running the head's
``process_weights_after_loading`` after the reload re-packs it from the (new) shared weight;
on GPU that call is a no-op for unquantized heads, which read ``layer.weight`` directly.
"""

from __future__ import annotations

from typing import Any


def _kinds(module: Any) -> set[str]:
    return {k.__name__ for k in type(module).__mro__}


def tied_heads(model: Any) -> list[Any]:
    """Output heads (``ParallelLMHead``) whose weight shares storage with an input embedding's
    (``VocabParallelEmbedding``): what ``tie_word_embeddings`` builds."""
    heads, embedding_ptrs = [], set()
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if weight is None or getattr(weight, "is_meta", False):
            continue
        kinds = _kinds(module)
        if "ParallelLMHead" in kinds:
            heads.append(module)
        elif "VocabParallelEmbedding" in kinds:
            embedding_ptrs.add(weight.data_ptr())
    return [h for h in heads if h.weight.data_ptr() in embedding_ptrs]


def refresh_tied_heads(model: Any) -> int:
    """Re-run each tied head's post-load processing (the CPU GEMM's packed copy is rebuilt
    from the shared weight, which holds the reloaded values). Returns how many were refreshed."""
    heads = tied_heads(model)
    for head in heads:
        head.quant_method.process_weights_after_loading(head)
    return len(heads)


class GyreWorkerExtension:
    """Mixed into vLLM's worker, which provides ``model_runner`` and ``reload_weights`` (vLLM
    refuses an extension that defines a name the worker has, so this class only adds
    ``gyre_*`` methods). Called by the adapter (:mod:`gyre.engine.vllm`) via ``/collective_rpc``."""

    def gyre_tied_heads(self) -> int:
        """How many tied output heads the served model has (changes nothing; the adapter calls
        it at start, which also proves this extension is loaded)."""
        worker: Any = self
        return len(tied_heads(worker.model_runner.get_model()))

    def gyre_reload_weights(self, weights_path: str) -> int:
        """vLLM's in-place reload from ``weights_path``, then the tied heads refreshed.
        Returns how many heads were refreshed."""
        worker: Any = self
        worker.reload_weights(weights_path=weights_path)
        return refresh_tied_heads(worker.model_runner.get_model())
