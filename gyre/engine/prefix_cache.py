"""A small prefix KV cache: reuse the K/V of an earlier request whose tokens start the new input.

Why: an agent turn is token-exact continuation (the proxy sends turn k's input +
turn k's output + the new tool result), so without reuse every turn prefills the
whole, ever-growing conversation again. Finished (or aborted) requests leave their
K/V here (input + the output tokens that were fed to the model); a new request
takes the entry with the longest common prefix and prefills only the rest.

This is a list with LRU eviction under a byte budget, not a radix tree: a
handful of live conversations per engine is what the embedded CPU engine
serves. Entries are private copies (``clone``), never views into the batch's
cache, so an entry never pins a whole batch tensor in memory.

Numerics: attention over cached K/V gives the same values as a full prefill up
to float rounding (the matmul shapes differ), so a continuation's log-probs
match a full forward pass to ~1e-6 rather than bit for bit.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class PrefixEntry:
    tokens: np.ndarray  # int64 token ids covered by the K/V
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, [1, H, L, D] each
    nbytes: int


class PrefixCache:
    def __init__(self, max_bytes: int, min_tokens: int = 16):
        self.max_bytes = int(max_bytes)
        self.min_tokens = int(min_tokens)
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()
        self._next = 0
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.hit_tokens = 0  # prompt tokens served from here instead of prefilled

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Forget everything (after a weights update the stored K/V belong to old weights)."""
        self._entries.clear()
        self.bytes = 0

    def put(self, tokens: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Keep the K/V for ``tokens`` (copied). Entries this one extends are dropped."""
        if self.max_bytes <= 0 or len(tokens) < self.min_tokens:
            return
        kv = [(k.clone(), v.clone()) for k, v in kv]
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if nbytes > self.max_bytes:
            return
        arr = np.asarray(tokens, dtype=np.int64)
        for key, e in list(self._entries.items()):
            if len(e.tokens) <= len(arr) and np.array_equal(e.tokens, arr[: len(e.tokens)]):
                self._drop(key)  # superseded by a longer entry of the same conversation
        self._entries[self._next] = PrefixEntry(tokens=arr, kv=kv, nbytes=nbytes)
        self._next += 1
        self.bytes += nbytes
        while self.bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: int) -> None:
        e = self._entries.pop(key)
        self.bytes -= e.nbytes

    def lookup(
        self, input_ids: list[int]
    ) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]]] | None:
        """(n, K/V of the first n tokens) for the best entry, n <= len(input_ids) - 1 (at least one token
        must be run to get logits), or None when no entry shares at least ``min_tokens``."""
        if not self._entries:
            self.misses += 1
            return None
        arr = np.asarray(input_ids, dtype=np.int64)
        best_key, best_n = None, 0
        for key, e in self._entries.items():
            m = min(len(e.tokens), len(arr))
            diff = np.flatnonzero(e.tokens[:m] != arr[:m])
            n = int(diff[0]) if diff.size else m
            if n > best_n:
                best_key, best_n = key, n
        best_n = min(best_n, len(arr) - 1)
        if best_key is None or best_n < self.min_tokens:
            self.misses += 1
            return None
        self._entries.move_to_end(best_key)
        self.hits += 1
        self.hit_tokens += best_n
        e = self._entries[best_key]
        return best_n, [(k[:, :, :best_n, :], v[:, :, :best_n, :]) for k, v in e.kv]
