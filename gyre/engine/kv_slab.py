"""A K/V cache layer that grows in place: a decode step writes one column, it copies nothing.

transformers' ``DynamicLayer.update`` appends with ``torch.cat``, so every decode step copies
each layer's whole K/V (``[B, H, L, D]``, twice) to add one column: O(L) bytes per step and
O(L^2) over a generation, which at 2K-8K tokens of agent context costs more than the
attention that reads it. A :class:`SlabLayer` keeps its K/V in a buffer with spare columns
(``[B, H, capacity, D]``) and exposes ``keys``/``values`` as views of its first ``L``
columns; ``update`` writes the new columns into the spare ones and re-slices. When the spare
runs out the buffer is reallocated with a quarter as much again to spare (amortised O(1) per
column).

The decode batch (``gyre.engine.batch``) still reassigns ``keys``/``values`` wholesale when
rows join (concatenated along the batch) or leave (``index_select``); the layer notices that
its view was replaced and adopts the new tensor into a fresh buffer at its next ``update``,
one copy: what ``torch.cat`` paid on every step. Values are the same bits either way: only
where they live changes.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

MIN_SPARE = 64  # columns added at least when a buffer is (re)allocated


class SlabLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` are views into a buffer with spare columns."""

    _buf_k: torch.Tensor | None = None
    _buf_v: torch.Tensor | None = None
    _view_k: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        old = self.get_seq_length()
        buf_k, buf_v = self._buf_k, self._buf_v
        if (
            buf_k is None
            or buf_v is None
            or self.keys is not self._view_k
            or buf_k.shape[0] != key_states.shape[0]
            or old + n > buf_k.shape[-2]
        ):
            buf_k, buf_v = self._adopt(old, n, key_states, value_states)
        buf_k[:, :, old : old + n] = key_states
        buf_v[:, :, old : old + n] = value_states
        self.keys = self._view_k = buf_k[:, :, : old + n]
        self.values = buf_v[:, :, : old + n]
        return self.keys, self.values

    def _adopt(
        self, old: int, n: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A new buffer holding the ``old`` columns of ``keys``/``values``, room for ``n`` more
        and spare beyond."""
        cap = old + n + max(MIN_SPARE, (old + n) // 4)
        buf_k = k.new_empty((k.shape[0], k.shape[1], cap, k.shape[3]))
        buf_v = v.new_empty((v.shape[0], v.shape[1], cap, v.shape[3]))
        if old:
            assert self.keys is not None and self.values is not None  # old > 0: they hold K/V
            buf_k[:, :, :old] = self.keys
            buf_v[:, :, :old] = self.values
        self._buf_k, self._buf_v = buf_k, buf_v
        return buf_k, buf_v

    def reset(self) -> None:
        self._buf_k = self._buf_v = self._view_k = None
        super().reset()


def slab_layers(cache):
    """Turn the plain ``DynamicLayer`` layers of a fresh ``DynamicCache`` into :class:`SlabLayer`
    (any other layer kind is left as it is); returns the cache."""
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            layer.__class__ = SlabLayer
    return cache
