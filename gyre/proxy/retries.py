"""SDK retries: the same body again (``x-stainless-retry-count > 0``) is never sampled again.

OpenAI/Anthropic SDKs retry on timeouts and 5xx with an identical body. A
retry of a call still running waits for it (coalesced); a retry of a finished
call gets the recorded answer again (replayed). Either way the trace keeps one
record and no second branch appears. A call that ended because its client went
away is not replayed: the retry is sampled (and recorded) normally.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from gyre.proxy.types import AssistantTurn


@dataclass(eq=False)
class RetryEntry:
    body: bytes
    result: asyncio.Future[AssistantTurn | None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def settle(self, turn: AssistantTurn | None) -> None:
        if not self.result.done():
            self.result.set_result(turn)


class RetryWindow:
    def __init__(self, size: int) -> None:  # proxy.retry_window
        self.entries: deque[RetryEntry] = deque(maxlen=max(size, 1))

    def find(self, body: bytes) -> RetryEntry | None:
        for e in reversed(self.entries):
            if len(e.body) == len(body) and e.body == body:
                return e
        return None

    def trim(self, keep: int) -> None:
        """Drop the bodies of finished calls but the newest ``keep`` entries (a retry of a dropped
        one is sampled afresh); a call still running keeps its entry, its retries coalesce."""
        old = list(self.entries)
        cut = max(len(old) - keep, 0)
        self.entries.clear()
        self.entries.extend(e for i, e in enumerate(old) if i >= cut or not e.result.done())

    def add(self, body: bytes) -> RetryEntry:
        e = RetryEntry(body)
        self.entries.append(e)
        return e


def retry_count(headers) -> int:
    try:
        return int(headers.get("x-stainless-retry-count", "0") or 0)
    except ValueError:
        return 0
