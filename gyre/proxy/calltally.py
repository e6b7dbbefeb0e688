"""Per-execution model-call counts: how many calls an execution made, how many the policy answered.

The harness executor asks for them when a harness stops (``GET
/admin/executions/{id}``): an execution whose calls all failed (no engine, every
call an error, the client gave up before an answer) never saw the policy, so its
workspace is not scored (``gyre.harness.model_calls``). Kept apart from the
execution's session state on purpose: that state is evicted when idle or under
memory pressure, and a forgotten answer would turn a real rollout into a
false "unreachable". An entry goes when the execution's keys are revoked; above
``cap`` entries (open mode, where nothing revokes) the oldest go first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class CallTally:
    attempted: int = 0  # requests that carried the execution's key
    answered: int = 0  # requests the policy answered (a trace record was written)
    last_error: str = ""  # why the last failed request failed


class CallTallies:
    def __init__(self, cap: int = 65536) -> None:
        self.cap = cap
        self._t: dict[str, CallTally] = {}

    def _get(self, execution_id: str) -> CallTally:
        t = self._t.get(execution_id)
        if t is None:
            if len(self._t) >= self.cap:
                del self._t[next(iter(self._t))]
            t = self._t[execution_id] = CallTally()
        return t

    def attempt(self, execution_id: str) -> None:
        self._get(execution_id).attempted += 1

    def answer(self, execution_id: str) -> None:
        self._get(execution_id).answered += 1

    def fail(self, execution_id: str, error: str) -> None:
        self._get(execution_id).last_error = error[:500]

    def drop(self, execution_id: str) -> None:
        self._t.pop(execution_id, None)

    def get(self, execution_id: str) -> dict[str, Any]:
        """The counts as the admin route returns them (zeros for an execution never seen)."""
        t = self._t.get(execution_id) or CallTally()
        return {
            "execution_id": execution_id,
            "attempted": t.attempted,
            "answered": t.answered,
            "last_error": t.last_error,
        }
