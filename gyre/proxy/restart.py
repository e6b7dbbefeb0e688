"""What a restarted proxy keeps of the one that died (:meth:`ProxyServer.restart`).

A proxy holds, in memory only:

* **keys** (managed mode): the executor registered one per execution over the admin socket and
  will not register again; without them every retried call is a 401. Carried.
* **call tallies** (attempted / answered per execution): the executor reads them when a harness
  stops to decide whether the policy ever answered it; a lost tally turns a real rollout into a
  false "unreachable". Carried.
* **execution states** (the calls each execution made, for token-exact continuation; the parsed
  bodies it sent): without them the next call of every execution is rendered in full
  (``bridge: full``) and may re-tokenise what the model wrote. Carried, and their sequence
  numbers with them (a fresh state would read them back from the trace file).
* **SDK-retry windows**: a call answered and recorded whose answer the crash cut off is retried
  by the SDK with the same body; the answered entries are carried, so the retry is a *replay* of
  the recorded answer and the trace keeps one record. Entries of calls still running at the
  crash are dropped: their retry is sampled afresh (nothing was recorded as answered for them).
* **counters**, the pool's engine-event listeners and the engines' API key. Carried.

Not carried: the pool's affinity and per-engine health (rebuilt by the first calls and the
heartbeat), trace file handles (reopened, appended to), and the tokens a call had generated
when the proxy died: a non-streamed call's engine request is not streamed, so the proxy held
none of them, and the SDK's retry starts the generation again (identical under greedy sampling,
a new sample otherwise); a stream under way is not retried by the SDKs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gyre.proxy.retries import RetryWindow

if TYPE_CHECKING:
    from gyre.proxy.executions import Execution
    from gyre.proxy.service import ProxyService


def carry_over(old: ProxyService, new: ProxyService) -> None:
    """Move the old service's registrations and states into ``new`` (neither is serving)."""
    new.keys = old.keys
    new.calls = old.calls
    new.counters = old.counters
    new.recorder.calls = old.calls
    new.recorder.counters = old.counters
    new.pool.api_key = old.pool.api_key
    new.pool.listeners = old.pool.listeners
    new.pool.counters = old.pool.counters
    new.pool.attempts.counters = old.pool.counters
    window = new.config.retry_window
    new.executions.adopt({k: _fresh(ex, window) for k, ex in old.executions.items()})


def _fresh(ex: Execution, window: int) -> Execution:
    retries = RetryWindow(window)
    for e in ex.retries.entries:
        # an answered call's future is done: awaiting a done future needs no loop, so it replays
        if e.result.done() and not e.result.cancelled() and e.result.result() is not None:
            retries.entries.append(e)
    return dataclasses.replace(ex, retries=retries, active=0)
