"""Incremental request-body parsing: re-use the parsed history a harness re-sends byte for byte.

A harness re-sends its whole conversation on every call: at 500K tokens that is
~2 MB of JSON, and parsing it again each call (plus allocating two million
characters of new strings) would make the proxy's cost per call grow with the
context. But the body of call k+1 starts with the same bytes as the body of
call k up to (almost) the end of the old messages. So, per execution, the last
few bodies are kept with the byte span of every element of their ``messages``
array (``input`` for the Responses API); a new body is compared with them (one ``memcmp``), every message that
lies entirely inside the common byte prefix is taken over as the *same Python
object*, and only the rest is parsed. Re-used objects also make the history
comparison in :mod:`gyre.proxy.session` an identity check.

Correctness does not depend on guessing: a message is re-used only if its
bytes are identical, and anything unexpected (no top-level ``messages`` array,
malformed JSON) falls back to parsing the whole body, which also produces the
usual JSON error.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass
from typing import Any

from gyre.proxy import jsonfast

# JSON strings (with escapes) or a structural character; everything else is skipped.
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},:]', re.S)
_WS = b" \t\r\n"


@dataclass
class ParsedBody:
    body: bytes
    data: dict[str, Any]
    array_start: int  # offset just after the '[' of the messages array
    spans: list[tuple[int, int]] | None  # byte span of each message element (None: not scanned yet)
    array_end: int  # offset of the closing ']' (-1: not scanned yet)
    ends: list[int] | None = None  # span ends (sorted), for bisect
    key: str = "messages"  # the history array's key: "messages", or "input" (Responses)

    def __post_init__(self) -> None:
        if self.ends is None and self.spans is not None:
            self.ends = [e for _, e in self.spans]

    def scan(self) -> bool:
        """Find the message spans (a Python pass over the body: done once per conversation, only
        when a later body turns out to share its prefix)."""
        if self.spans is not None:
            return True
        split = _split_elements(self.body, self.array_start)
        if split is None or len(split[0]) != len(self.data[self.key]):
            return False
        self.spans, self.array_end = split
        self.ends = [e for _, e in self.spans]
        return True


def _common_prefix(a: bytes, b: bytes, hint: int = 0) -> int:
    """Length of the common prefix: a binary search of memcmp's (``startswith`` on memoryview
    slices compares in C without copying; comparing two memoryviews would go item by item).
    ``hint``: where ``a`` probably stops matching (its last message), probed first."""
    n = min(len(a), len(b))
    ma = memoryview(a)
    lo = 0
    if 0 < hint < n and b.startswith(ma[:hint]):
        lo = hint
    if b.startswith(ma[lo:n], lo):
        return n
    hi = n  # invariant: a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 256:
        mid = (lo + hi) // 2
        if b.startswith(ma[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


def _find_messages_array(body: bytes, key: str = "messages") -> int | None:
    """Offset just after the '[' of the top-level ``key`` value (depth 1), or None."""
    want = b'"' + key.encode() + b'"'
    depth = 0
    last_key: bytes | None = None
    expect_value = False
    for m in _TOKEN.finditer(body):
        t = m.group()
        c = t[:1]
        if c == b'"':
            if depth == 1 and not expect_value:
                last_key = t
            expect_value = False
        elif c == b":":
            expect_value = depth == 1
        elif c in b"[{":
            if c == b"[" and depth == 1 and expect_value and last_key == want:
                return m.end()
            depth += 1
            expect_value = False
        elif c in b"]}":
            depth -= 1
        else:  # comma
            expect_value = False
    return None


def _split_elements(body: bytes, pos: int) -> tuple[list[tuple[int, int]], int] | None:
    """Byte spans of the elements of the array whose content starts at ``pos``, and its closing offset."""
    spans: list[tuple[int, int]] = []
    depth = 0
    start: int | None = None
    i = pos
    n = len(body)
    while True:
        while i < n and body[i] in _WS:
            i += 1
        if i >= n:
            return None
        if depth == 0 and body[i] == 0x5D:  # ']'
            if start is not None:
                spans.append((start, _rstrip(body, start, i)))
            return spans, i
        m = _TOKEN.search(body, i)
        if m is None:
            return None
        if start is None:
            start = i
        t = m.group()
        c = t[:1]
        i = m.end()
        if c in b"[{":
            depth += 1
        elif c in b"]}":
            depth -= 1
            if depth < 0:
                if start is not None:
                    spans.append((start, _rstrip(body, start, m.start())))
                return spans, m.start()
        elif c == b"," and depth == 0:
            spans.append((start, _rstrip(body, start, m.start())))
            start = None


def _rstrip(body: bytes, start: int, end: int) -> int:
    while end > start and body[end - 1] in _WS:
        end -= 1
    return end


def _full(body: bytes) -> tuple[Any, ParsedBody | None]:
    """Plain parse; the body is kept (unscanned) in case the next one extends it."""
    data = jsonfast.loads(body)  # raises on malformed JSON: the caller answers 400
    if not isinstance(data, dict):
        return data, None
    key = "messages" if isinstance(data.get("messages"), list) else "input"
    if not isinstance(data.get(key), list):
        return data, None
    a = _find_messages_array(body, key)
    if a is None:
        return data, None
    return data, ParsedBody(body=body, data=data, array_start=a, spans=None, array_end=-1, key=key)


class BodyParser:
    """Per-execution parser that re-uses the messages of recent bodies (see module doc)."""

    def __init__(self, keep: int = 4, min_reuse_bytes: int = 16384) -> None:
        self.recent: deque[ParsedBody] = deque(maxlen=max(keep, 1))
        self.min_reuse_bytes = min_reuse_bytes
        self.reused_messages = 0
        self.full_compares = 0  # memcmp's against kept bodies (one per call as a rule; see parse)

    def bodies(self) -> list[bytes]:
        """The bodies kept (each also holds its parsed messages, about as large)."""
        return [p.body for p in self.recent]

    def trim(self, keep: int) -> None:
        """Keep only the newest ``keep`` bodies (the proxy's budget for held bodies, see
        :meth:`gyre.proxy.executions.Executions.account`); a later body that extended a dropped
        one is parsed in full, nothing else changes."""
        while len(self.recent) > keep:
            self.recent.popleft()

    def discard(self, body: bytes) -> None:
        """Forget a body that was refused after parsing (a huge one must not stay alive here)."""
        for p in [p for p in self.recent if p.body is body]:
            self.recent.remove(p)

    def parse(self, body: bytes) -> Any:
        if len(body) < self.min_reuse_bytes:  # small: parsing is cheaper than bookkeeping
            return jsonfast.loads(body)
        best, best_l = None, 0
        for p in reversed(self.recent):  # newest first: the body this one extends, as a rule
            if len(p.body) <= p.array_start:
                continue
            # An older body can only do better if it agrees with this one *beyond* the best match so
            # far: one byte rules most out, so a call pays one full memcmp, not one per kept body.
            # (Only the choice is cheap: whatever is re-used was compared byte for byte.)
            if best is not None and (
                best_l >= len(p.body) or best_l >= len(body) or p.body[best_l] != body[best_l]
            ):
                continue
            self.full_compares += 1
            shared = _common_prefix(p.body, body, p.spans[-1][0] if p.spans else 0)
            if shared > best_l:
                best, best_l = p, shared
        if best is None or best_l <= best.array_start:
            data, pb = _full(body)
            if pb is not None:
                self.recent.append(pb)
            return data
        if not best.scan():
            self.recent.remove(best)
            data, pb = _full(body)
            if pb is not None:
                self.recent.append(pb)
            return data
        try:
            return self._extend(best, body, best_l)
        except Exception:  # anything unexpected: the plain way (errors are reported from there)
            data, pb = _full(body)
            if pb is not None:
                self.recent.append(pb)
            return data

    def _extend(self, prev: ParsedBody, body: bytes, common: int) -> Any:
        spans, ends = prev.spans, prev.ends
        assert spans is not None and ends is not None  # the caller scanned prev
        # messages whose bytes lie entirely in the common prefix are the same objects
        k = bisect_right(ends, common)  # elements ending at or before the divergence
        if k and ends[k - 1] == common:
            s = spans[k - 1][0]
            # objects, arrays and strings close themselves; a number could continue (12 -> 123)
            if prev.body[s : s + 1] not in (b"{", b"[", b'"'):
                k -= 1
        if k == 0:
            data, pb = _full(body)
            if pb is not None:
                self.recent.append(pb)
            return data
        resume = spans[k - 1][1]  # just after element k-1, in both bodies
        split = _split_elements(body, resume + 1) if body[resume : resume + 1] == b"," else None
        if body[resume : resume + 1] == b",":
            if split is None:
                raise ValueError("unsplittable tail")
            new_spans, end = split
        else:
            rest = resume
            while rest < len(body) and body[rest] in _WS:
                rest += 1
            if body[rest : rest + 1] != b"]":
                raise ValueError("unexpected tail")
            new_spans, end = [], rest
        old = prev.data[prev.key]
        msgs = old[:k] + [jsonfast.loads(body[s:e]) for s, e in new_spans]
        top = jsonfast.loads(
            body[: prev.array_start] + body[end:]
        )  # every other field, messages = []
        if not isinstance(top, dict) or top.get(prev.key) != []:
            raise ValueError("top level changed shape")
        top[prev.key] = msgs
        self.reused_messages += k
        pb = ParsedBody(
            body=body,
            data=top,
            array_start=prev.array_start,
            spans=spans[:k] + new_spans,
            array_end=end,
            ends=ends[:k] + [e for _, e in new_spans],
            key=prev.key,
        )
        self.recent.append(pb)
        return top
