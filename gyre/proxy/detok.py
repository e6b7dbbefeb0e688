"""Incremental detokenisation: emit text as tokens arrive without decoding the whole output each time.

The usual two-offset scheme (as in TGI/vLLM): decode a short window before the
new tokens and the window plus the new tokens, and emit the difference; hold
back while the text ends in an incomplete UTF-8 sequence (U+FFFD).
"""

from __future__ import annotations

from typing import Any


class Detokenizer:
    def __init__(self, tokenizer: Any, skip_ids: frozenset[int] = frozenset()) -> None:
        self.tok = tokenizer
        self.skip = skip_ids
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def add(self, new_ids: list[int]) -> str:
        self.ids.extend(t for t in new_ids if t not in self.skip)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.ids[self.prefix_offset :])
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix) :] if len(full) > len(prefix) else ""
