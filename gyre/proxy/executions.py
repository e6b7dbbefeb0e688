"""The proxy's live executions: each one's bridging state, retry window and body parser.

An execution's state is made on its first request (continuing the numbering of a trace
file a restarted proxy finds) and kept in least-recently-used order. Why bounded: in open
mode nothing else ends an execution, and a managed run that forgets to revoke must not
grow the proxy without bound, so idle states are swept and the oldest idle ones make room
past ``max_executions``. Forgetting a state keeps its key valid and its trace file on disk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gyre.proxy.bodyparse import BodyParser
from gyre.proxy.config import ProxyConfig
from gyre.proxy.counters import ProxyCounters
from gyre.proxy.identity import Identity
from gyre.proxy.pool import EnginePool
from gyre.proxy.retries import RetryWindow
from gyre.proxy.session import ExecutionState
from gyre.trace.store import TraceWriter, read_trace, trace_path


@dataclass
class Execution:
    ident: Identity
    state: ExecutionState
    retries: RetryWindow
    bodies: BodyParser
    last_used: float = 0.0  # time.monotonic() of its last request
    active: int = 0  # generations in flight: an execution is never evicted while > 0


class Executions:
    """The live execution states by execution id; dict order is least recently used first."""

    def __init__(
        self,
        config: ProxyConfig,
        pool: EnginePool,
        writer: TraceWriter,
        counters: ProxyCounters,
    ) -> None:
        self.config = config
        self.pool = pool
        self.writer = writer
        self.counters = counters
        self._live: dict[str, Execution] = {}

    def __len__(self) -> int:
        return len(self._live)

    def items(self) -> list[tuple[str, Execution]]:
        return list(self._live.items())

    def adopt(self, live: dict[str, Execution]) -> None:
        """Take over a restarted proxy's states (:mod:`gyre.proxy.restart`), in their LRU order."""
        self._live = dict(live)

    def get(self, ident: Identity) -> Execution:
        """The execution's state (made on its first request), marked most recently used."""
        ex = self._live.pop(ident.execution_id, None)  # re-inserted last: dict order is LRU
        if ex is None:
            self._make_room()
            st = ExecutionState(
                execution_id=ident.execution_id,
                label=ident.label,
                hot_nodes=self.config.prefix_cache_nodes,
            )
            path = trace_path(self.config.trace_dir, ident.execution_id)
            if path.exists():  # a restarted proxy continues the execution's numbering
                recs = read_trace(path).records
                st.next_seq = max((r.seq for r in recs), default=-1) + 1
            ex = Execution(
                ident=ident,
                state=st,
                retries=RetryWindow(self.config.retry_window),
                bodies=BodyParser(),
            )
        self._live[ident.execution_id] = ex
        ex.last_used = time.monotonic()
        return ex

    def sweep(self, now: float | None = None) -> int:
        """Drop executions idle for ``execution_idle_s`` (state and trace handle); returns how many."""
        now = time.monotonic() if now is None else now
        idle = [
            k
            for k, ex in self._live.items()
            if ex.active == 0 and now - ex.last_used > self.config.execution_idle_s
        ]
        for k in idle:
            self.evict(k)
        self.writer.close_idle(self.config.execution_idle_s)
        return len(idle)

    def evict(self, execution_id: str) -> None:
        """Forget an execution's in-memory state (its key stays valid; the trace file stays)."""
        self.drop(execution_id)
        self.counters.evicted_executions += 1

    def drop(self, execution_id: str) -> None:
        """Forget the state, the pool's placement and the open trace handle of one execution."""
        self._live.pop(execution_id, None)
        self.pool.forget(execution_id)
        self.writer.close_execution(execution_id)

    def _make_room(self) -> None:
        """Above ``max_executions`` live states, drop the least recently used idle ones."""
        excess = len(self._live) - self.config.max_executions + 1
        if excess <= 0:
            return
        for k in [k for k, ex in self._live.items() if ex.active == 0][:excess]:
            self.evict(k)
