"""The standalone rollout pool (C_s): its engines started, and one that died replaced.

Each engine is a Ray actor of its own (:class:`gyre.runtime.cell.StandaloneEngine`) serving
a fixed share of ``policy.standalone_capacity`` (:func:`share`). When one is found dead or
hung (the proxy's engine heartbeat, or a reload that failed in a publication) it leaves the
pool at once (the cluster's ``_engine_lost``) and the policy gets ``EngineLost`` with its
share, so the waterlevel rule and the retention test count only what serves; with
``run.fault.restart`` a new actor starts on the newest published weights, joins the proxy's
pool, and the policy gets ``EngineBack``.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import ray

from gyre.cli_errors import first_line
from gyre.log import LogSpec
from gyre.policy import EngineBack, EngineLost
from gyre.runtime.cell import StandaloneEngine
from gyre.runtime.config import GyreConfig
from gyre.runtime.handles import EventBus
from gyre.runtime.publication import Publications
from gyre.runtime.records import FaultRecord, Records
from gyre.runtime.seeds import SEED_STRIDE


def share(capacity: int, engines: int, j: int) -> int:
    """Engine ``j``'s slots of the pool's ``capacity`` over ``engines`` (the first ones take
    the remainder): what its loss takes from the rollout side."""
    return capacity // engines + (1 if j < capacity % engines else 0)


async def start_one(
    cfg: GyreConfig,
    pubs: Publications,
    j: int,
    runtime_env: dict[str, Any],
    log_spec: LogSpec,
    restart: int = 0,
) -> tuple[Any, str]:
    """Standalone engine ``j``'s actor, serving the newest published weights, and its URL
    (``restart``: how many replaced it before, so each process draws its own seed)."""
    res, ecfg = cfg.run.cell, cfg.engine
    svc = ray.remote(StandaloneEngine).options(
        num_cpus=0, resources=res.resources or None, runtime_env=runtime_env
    )
    await pubs.settled()  # start on the version being published, not the last
    actor: Any = None

    async def start(weights_dir: str, version: int) -> str:
        nonlocal actor
        ecfg_j = ecfg.model_copy(
            update={
                "model_dir": weights_dir,
                "engine_id": f"standalone-{j}",
                "weight_version": version,
                "seed": ecfg.seed * SEED_STRIDE + 104729 + j + 7919 * restart,
            }
        )
        actor = svc.remote(ecfg_j, res.torch_threads, pubs.engine_key, log_spec)
        return await actor.start.remote()

    try:
        url = await pubs.start_on_newest(start)
    except Exception:  # broad on purpose: cleanup only, the error goes on as it is
        if actor is not None:
            ray.kill(actor)
        raise
    return actor, url


class StandalonePool(Protocol):
    """What the engine fault handler needs of the cluster that owns the standalone engines."""

    def standalone_of(self, url: str) -> int | None: ...

    async def replace_standalone(self, j: int, restart: int) -> None: ...


class EngineFaults:
    """The world's handler for a lost standalone engine: the policy told, a new one started."""

    def __init__(
        self, cfg: GyreConfig, pool: StandalonePool, records: Records, bus: EventBus
    ) -> None:
        self.cfg, self.pool, self.records, self.bus = cfg, pool, records, bus
        self.restarts: dict[int, int] = {}

    def lost(self, url: str, why: BaseException, where: str) -> None:
        """The engine at ``url`` left the pool (the cluster's ``_engine_lost``): its slots leave
        the policy's capacity, and a new engine is started for it."""
        j = self.pool.standalone_of(url)
        if j is None:
            return
        cfg, bus = self.cfg, self.bus
        slots = share(cfg.policy.standalone_capacity, cfg.run.standalone_engines, j)
        rec = self.records.fault(
            cell=None,
            kind="engine",
            role="standalone",
            at=bus.now(),
            detected_by=where,
            cause=first_line(why)[:200],
            action="restart" if cfg.run.fault.restart else "none",
            engine=j,
            capacity=slots,
        )
        bus.emit(EngineLost(time=bus.now(), capacity=slots))
        if cfg.run.fault.restart:
            bus.spawn(self._replace(j, slots, rec))

    async def _replace(self, j: int, slots: int, rec: FaultRecord) -> None:
        t0 = time.perf_counter()
        n = self.restarts[j] = self.restarts.get(j, 0) + 1
        await self.pool.replace_standalone(j, n)
        restart_s = round(time.perf_counter() - t0, 3)
        self.records.complete(rec, restart_s=restart_s, back=round(self.bus.now(), 3))
        self.bus.emit(EngineBack(time=self.bus.now(), capacity=slots))
