"""The proxy's live executions: each one's bridging state, retry window and body parser.

An execution's state is made on its first request (continuing the numbering of a trace
file a restarted proxy finds) and kept in least-recently-used order. Why bounded: in open
mode nothing else ends an execution, and a managed run that forgets to revoke must not
grow the proxy without bound, so idle states are swept and the oldest idle ones make room
past ``max_executions``. Forgetting a state keeps its key valid and its trace file on disk.

What the states hold of the requests themselves is bounded too (:meth:`Executions.account`).
Continuation needs token ids and the tool-call payloads by call id, which are small; the raw
bodies (for incremental parsing and SDK-retry matching) and each recent call's raw messages
(for the C-level history compare) only make it cheap, and they are as large as the requests:
10 keys x 4 answered calls with a 20 MB unknown content part held 1.6 GB after their answers.
Past ``max_held_body_bytes`` in all, the least recently used executions first keep only their
newest body and newest call's messages, then none: their next call is parsed in full and its
history compared on normalised messages, with the same tokens.
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
    held: int = 0  # bytes of request bodies and raw messages it held when last counted

    def count_held(self) -> int:
        """Bytes of request data this execution holds: its kept bodies (the parser's and the
        retry window's, each counted once) and its recent calls' raw messages (about their
        body's size again: parsed, they take at least as much)."""
        bodies = {id(b): len(b) for b in self.bodies.bodies()}
        bodies.update((id(e.body), len(e.body)) for e in self.retries.entries)
        return sum(bodies.values()) + self.state.held_raw_bytes()

    def shed(self, level: int) -> None:
        """Level 1: keep only the newest body and call's raw messages; 2: none of them."""
        keep = 1 if level == 1 else 0
        self.bodies.trim(keep)
        self.retries.trim(keep)
        self.state.trim_raw(keep)


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
        self.held_bytes = 0  # sum of the executions' ``held`` (see account)

    def __len__(self) -> int:
        return len(self._live)

    def items(self) -> list[tuple[str, Execution]]:
        return list(self._live.items())

    def adopt(self, live: dict[str, Execution]) -> None:
        """Take over a restarted proxy's states (:mod:`gyre.proxy.restart`), in their LRU order."""
        self._live = dict(live)
        self.held_bytes = 0
        for ex in self._live.values():
            ex.held = ex.count_held()
            self.held_bytes += ex.held

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

    def account(self, ex: Execution) -> None:
        """Count what ``ex`` holds now (after a call parsed or ended), and keep the total under
        ``max_held_body_bytes``: least recently used executions other than ``ex`` shed what
        makes their next call cheap, first all but the newest, then everything (see module)."""
        if self._live.get(ex.ident.execution_id) is not ex:
            return  # dropped meanwhile (revoked, evicted): holds nothing the proxy keeps
        self._recount(ex)
        budget = self.config.max_held_body_bytes
        for level in (1, 2):
            for other in list(self._live.values()):
                if self.held_bytes <= budget:
                    return
                if other is not ex and other.held > 0:
                    before = other.held
                    other.shed(level)
                    self._recount(other)
                    self.counters.shed_bodies += int(other.held < before)

    def _recount(self, ex: Execution) -> None:
        held = ex.count_held()
        self.held_bytes += held - ex.held
        ex.held = held

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
        ex = self._live.pop(execution_id, None)
        if ex is not None:
            self.held_bytes -= ex.held
        self.pool.forget(execution_id)
        self.writer.close_execution(execution_id)

    def _make_room(self) -> None:
        """Above ``max_executions`` live states, drop the least recently used idle ones."""
        excess = len(self._live) - self.config.max_executions + 1
        if excess <= 0:
            return
        for k in [k for k, ex in self._live.items() if ex.active == 0][:excess]:
            self.evict(k)
