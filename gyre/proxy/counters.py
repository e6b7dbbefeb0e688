"""The proxy's counters as typed records (``/admin/stats`` shows them as flat dicts).

Why dataclasses: a misspelt counter is an AttributeError at the line that bumps it (a dict
grew a new key silently), and mypy checks every reader.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

BridgeMode = Literal["continuation", "resample", "full", "template_fallback"]
"""How a call's prompt was built (see :mod:`gyre.proxy.service`, ``Plan.mode``)."""


@dataclass
class BridgeCounts:
    """Answered calls by how their prompt was built, and how many forked."""

    continuation: int = 0
    resample: int = 0
    full: int = 0
    template_fallback: int = 0
    forked: int = 0

    def note(self, mode: BridgeMode, forked: bool) -> None:
        setattr(self, mode, getattr(self, mode) + 1)
        self.forked += int(forked)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ProxyCounters(BridgeCounts):
    requests: int = 0
    answered: int = 0
    bridge_mismatch: int = 0
    retries_replayed: int = 0
    retries_coalesced: int = 0
    client_disconnects: int = 0
    errors_4xx: int = 0
    errors_5xx: int = 0
    record_failures: int = 0
    evicted_executions: int = 0
    shed_bodies: int = 0  # executions that dropped kept bodies for max_held_body_bytes
    sampling_overridden: int = 0  # calls whose harness sampling params the run's replaced

    def error(self, status: int) -> None:
        if status < 500:
            self.errors_4xx += 1
        else:
            self.errors_5xx += 1


@dataclass
class PoolCounters:
    requests: int = 0
    moved: int = 0
    engine_errors: int = 0
    engine_timeouts: int = 0
    protocol_errors: int = 0
    backoff_waits: int = 0
    probes: int = 0
    probes_failed: int = 0
    heartbeats: int = 0
    heartbeats_failed: int = 0
    heartbeat_stalls: int = 0  # ticks far later than due (the proxy's loop was blocked)
    engines_lost: int = 0  # declared lost by the heartbeat, or removed as lost (a lost cell)
    engines_back: int = 0  # lost ones that answered again
    # KV migration (gyre.proxy.kvmove): calls moved with their K/V, and those prefilled again
    kv_migrated: int = 0
    kv_bytes: int = 0  # K/V bytes moved
    kv_tokens: int = 0  # context tokens whose prefill the moves skipped
    kv_transfer_s: float = 0.0  # export + import, summed
    kv_saved_s: float = 0.0  # the targets' estimate of those prefills, less the transfers
    kv_fallback_version: int = 0  # K/V computed under other weights than the target's
    kv_fallback_room: int = 0  # the target had no room for it
    kv_fallback_unsupported: int = 0  # an engine that cannot move K/V (vLLM, SGLang, scripted)
    kv_fallback_other: int = 0  # nothing parked, a transfer error or timeout

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
