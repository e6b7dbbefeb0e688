"""The standalone rollout pool (C_s): its engines started, and one that died replaced.

Each engine is a Ray actor of its own (:class:`gyre.runtime.cell.StandaloneEngine`) serving
a fixed share of ``policy.standalone_capacity`` (:func:`share`). When one is found dead or
hung (the proxy's engine heartbeat, or a reload that failed in a publication) it leaves the
pool at once (``Cluster._engine_lost``) and the policy gets ``EngineLost`` with its share, so
the waterlevel rule and the retention test count only what serves; with
``run.fault.restart`` a new actor starts on the newest published weights, joins the proxy's
pool, and the policy gets ``EngineBack``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import TYPE_CHECKING, Any

import ray

from gyre.engine.client import EngineClient
from gyre.policy import EngineBack, EngineLost
from gyre.runtime.cell import StandaloneEngine
from gyre.runtime.engines import engine_start_error
from gyre.runtime.seeds import SEED_STRIDE

if TYPE_CHECKING:
    from gyre.runtime.cluster import Cluster
    from gyre.runtime.world import RealWorld


def share(capacity: int, engines: int, j: int) -> int:
    """Engine ``j``'s slots of the pool's ``capacity`` over ``engines`` (the first ones take
    the remainder): what its loss takes from the rollout side."""
    return capacity // engines + (1 if j < capacity % engines else 0)


async def start_one(cl: Cluster, j: int, restart: int = 0) -> tuple[Any, str]:
    """Standalone engine ``j``'s actor, serving the newest published weights, and its URL
    (``restart``: how many replaced it before, so each process draws its own seed)."""
    res, ecfg = cl.cfg.run.cell, cl.cfg.engine
    svc = ray.remote(StandaloneEngine).options(
        num_cpus=0, resources=res.resources or None, runtime_env=cl._runtime_env
    )
    while cl._publishing is not None:  # start on the version being published, not the last
        await cl._publishing.wait()
    version = cl.weights_version
    cfg = ecfg.model_copy(
        update={
            "model_dir": cl.weights_dir,
            "engine_id": f"standalone-{j}",
            "weight_version": version,
            "seed": ecfg.seed * SEED_STRIDE + 104729 + j + 7919 * restart,
        }
    )
    a: Any = svc.remote(cfg, res.torch_threads, cl.engine_key, cl.log_spec(f"standalone-{j}"))
    cl._loading[version] += 1  # kept from pruning while it loads
    try:
        url = await a.start.remote()
        while version != cl.weights_version or cl._publishing is not None:  # caught up
            if cl._publishing is not None:
                await cl._publishing.wait()
                continue
            version = cl.weights_version
            async with EngineClient(url, api_key=cl.engine_key) as c:
                await c.update_weights_from_disk(cl.weights_dir, weight_version=version)
    except Exception:
        ray.kill(a)
        raise
    finally:
        cl._loading -= Counter({cfg.weight_version: 1})  # drops it at 0
    return a, url


async def start_pool(cl: Cluster, error: type[Exception]) -> None:
    """Every engine of the pool at start; one that fails stops everything with one line."""
    for j in range(cl.cfg.run.standalone_engines):
        try:
            a, url = await start_one(cl, j)
        except Exception as e:
            await cl.stop()
            raise error(f"standalone engine {j} did not start: {engine_start_error(e)}") from None
        cl.standalone.append((a, url))
        row = {"standalone": j, "pid": await a.pid.remote(), "node": await a.node.remote()}
        cl.placement.append({**row, "url": url})


class EngineFaults:
    """The world's handler for a lost standalone engine: the policy told, a new one started."""

    def __init__(self, world: RealWorld) -> None:
        self.world = world
        self.restarts: dict[int, int] = {}

    def _engine_of(self, url: str) -> int | None:
        rows = self.world.cluster.placement
        return next((r["standalone"] for r in rows if "standalone" in r and r["url"] == url), None)

    def lost(self, url: str, why: BaseException, where: str) -> None:
        """The engine at ``url`` left the pool (``Cluster._engine_lost``): its slots leave the
        policy's capacity, and a new engine is started for it."""
        w = self.world
        j = self._engine_of(url)
        if j is None:
            return
        p = w.cfg.policy
        slots = share(p.standalone_capacity, w.cfg.run.standalone_engines, j)
        rec: dict[str, Any] = {
            "cell": None,
            "engine": j,
            "kind": "engine",
            "role": "standalone",
            "time": round(w.now(), 3),
            "unix_time": round(time.time(), 3),
            "detected_by": where,
            "cause": (str(why).strip().splitlines() or [type(why).__name__])[0][:200],
            "action": "restart" if w.cfg.run.fault.restart else "none",
            "capacity": slots,
            "back": None,
            "segment": w.records.segment,
        }
        w.records.faults.append(rec)
        w._emit(EngineLost(time=w.now(), capacity=slots))
        if w.cfg.run.fault.restart:
            w._spawn(self._replace(j, url, slots, rec))

    async def _replace(self, j: int, url: str, slots: int, rec: dict[str, Any]) -> None:
        w, cl = self.world, self.world.cluster
        old = next((r for r in cl.placement if r.get("standalone") == j), None)
        t0 = time.perf_counter()
        n = self.restarts[j] = self.restarts.get(j, 0) + 1
        a, new_url = await start_one(cl, j, restart=n)
        await asyncio.to_thread(cl.live_proxy.add_engine, new_url)
        cl.standalone.append((a, new_url))
        if old is not None:  # cells.json names the new process
            old.update(pid=await a.pid.remote(), url=new_url, restarts=n)
            w.rundir.write_cells(cl.placement)
        rec["restart_s"] = round(time.perf_counter() - t0, 3)
        rec["back"] = round(w.now(), 3)
        rec["cost_s"] = round(rec["back"] - rec["time"], 3)
        w._emit(EngineBack(time=w.now(), capacity=slots))
