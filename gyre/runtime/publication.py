"""Is every engine serving the weights the core published? Checked after each publication.

The core returns the fingerprints of the weights it wrote (:mod:`gyre.engine.checksum`, one
per dtype an engine may hold them in); each engine reports the fingerprint of what it holds
in memory after the reload (``weights_checksum`` in its reload response and model info). A
difference means the engine would sample the next burst from weights nobody trains, and
every trace it records would carry a version that lies: the run stops with one line naming
the engine. Engines that report no fingerprint (vLLM, SGLang) are not checked; the count of
checked engines is in each publication's record.

With ``run.publication = "distributed"`` the core also sends each publication in memory
(:class:`MemoryPublisher`, SGLang's ``update_weights_from_distributed``); the HF directory is
still written, for engines that start later and as the fallback when the in-memory path fails.

:func:`publish` is the driver's side of a publication (:meth:`Cluster.publish
<gyre.runtime.cluster.Cluster.publish>`): the core writes the directory, every rollout engine
pauses, reloads (or receives it in memory) and continues, each is checked, and published
directories past ``run.keep_published`` are pruned.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gyre.engine.client import EngineClient
from gyre.engine.protocol import ModelInfo, UpdateWeightsResponse

if TYPE_CHECKING:
    from gyre.runtime.cluster import Cluster

log = logging.getLogger("gyre.runtime.publication")


class PublicationError(RuntimeError):
    """An engine does not serve the weights the core published (the run cannot go on)."""


def check_served(
    engine: str,
    version: int,
    reply: UpdateWeightsResponse | ModelInfo,
    published: dict[str, float],
) -> bool:
    """Raise :class:`PublicationError` if ``engine``'s ``reply`` shows other weights than the
    core's ``published`` fingerprints of ``version``; ``False`` if it cannot tell (no
    fingerprint reported), ``True`` if checked and equal."""
    if reply.weight_version is not None and str(reply.weight_version) != str(version):
        raise PublicationError(
            f"{engine} reports weights version {reply.weight_version} after the publication of "
            f"version {version}; stopping the run"
        )
    got, dtype = reply.weights_checksum, reply.weights_dtype or "float32"
    want = published.get(dtype)
    if got is None or want is None:
        return False
    if got != want:
        raise PublicationError(
            f"{engine} does not serve the published weights of version {version} "
            f"({dtype} checksum {got!r}, the core's {want!r}); stopping the run"
        )
    return True


class MemoryPublisher:
    """The core's end of ``run.publication = "distributed"``: rank 0 of a weight group with the
    rollout engines (:class:`gyre.train.weight_sync.DistributedWeightChannel`), rebuilt when the
    set of engines changes (a cell switched, an engine was lost). Lives in the core's process;
    each call runs its own event loop (the cell actor's methods are synchronous)."""

    def __init__(self, master_address: str = "127.0.0.1"):
        self.master_address = master_address
        self.channel: Any = None
        self.urls: tuple[str, ...] = ()

    def publish(self, version: int, params: dict[str, Any], urls: list[str]) -> dict[str, Any]:
        """Every engine at ``urls`` serves ``params`` as ``version`` when this returns; raises
        when any engine did not take them. ``replies`` (for :func:`check_served`), and what was
        sent: ``encoding`` (raw or the delta codec), ``bytes`` per engine, ``raw_bytes``."""
        return asyncio.run(self._publish(version, params, tuple(urls)))

    async def _publish(
        self, version: int, params: dict[str, Any], urls: tuple[str, ...]
    ) -> dict[str, Any]:
        # lazy: the driver imports this module and never loads torch
        from gyre.train.weight_sync import DistributedWeightChannel

        if self.channel is None or urls != self.urls:
            if self.channel is not None:
                await self.channel.close()
                self.channel = None
            channel = DistributedWeightChannel(list(urls), master_address=self.master_address)
            await channel.connect()
            self.channel, self.urls = channel, urls
        try:
            stats = await self.channel.publish(version, params)
        except BaseException:
            self.channel, self.urls = None, ()  # the next publication starts a fresh group
            raise
        return {
            "replies": stats.replies,
            "encoding": stats.encoding,
            "bytes": stats.payload_bytes,
            "raw_bytes": stats.raw_bytes,
            "full_resends": stats.full_resends,
        }


async def publish(cl: Cluster, version: int, rollout_cells: list[int]) -> dict[str, Any]:
    """The core writes version ``version``; every rollout engine pauses, reloads it, continues."""
    cl.begin_publish()
    publishing = cl._publishing
    assert publishing is not None  # begin_publish made it; only this method clears it
    try:
        t0 = time.perf_counter()
        path = str(cl.rundir.weights / f"v{version}")
        sums = await cl.cells[0].save_hf.remote(path)
        t_save = time.perf_counter() - t0
        cl.weights_dir, cl.weights_version, cl.weights_sums = path, version, sums

        async def reload(url: str) -> Any:
            async with EngineClient(url, api_key=cl.engine_key) as c:
                await c.pause()
                try:
                    return await c.update_weights_from_disk(path, weight_version=version)
                finally:
                    await c.resume()

        urls = [u for u in (cl.urls[c] for c in rollout_cells) if u] + [u for _, u in cl.standalone]
        info: dict[str, Any] = {}
        results = await _in_memory(cl, version, urls, info)
        if results is None:  # run.publication = "disk", or the in-memory path failed
            results = await asyncio.gather(*[reload(u) for u in urls], return_exceptions=True)
        checked = 0
        for u, r in zip(urls, results):
            if isinstance(r, BaseException):
                await cl._engine_lost(u, r)
            else:  # it reloaded: does it serve what the core wrote?
                checked += check_served(cl._engine_name(u), version, r, sums)
        cl.engines_checked += checked
        _prune_weights(cl, version, cl.cfg.run.keep_published)
        return {"engines": len(urls), "checked": checked, "save_seconds": t_save, **info}
    finally:
        publishing.set()
        cl._publishing = None


async def _in_memory(cl: Cluster, version: int, urls: list[str], info: dict) -> list | None:
    """``run.publication = "distributed"``: the core sends ``version`` to ``urls`` over a
    weight group (engines paused meanwhile); their replies (what was sent goes in ``info``),
    or None to reload from disk."""
    if cl.cfg.run.publication != "distributed" or not urls:
        return None
    clients = [EngineClient(u, api_key=cl.engine_key) for u in urls]
    try:
        await asyncio.gather(*[c.pause() for c in clients])
        sent = await cl.cells[0].publish_in_memory.remote(version, urls)
        cl.engines_in_memory += len(urls)
        info["memory"] = {k: v for k, v in sent.items() if k != "replies"}
        return sent["replies"]
    except Exception as e:  # the fallback: every engine reloads the directory just written
        log.warning("in-memory publication of v%d failed (%s); reloading from disk", version, e)
        return None
    finally:
        await asyncio.gather(*[c.resume() for c in clients], return_exceptions=True)
        await asyncio.gather(*[c.aclose() for c in clients], return_exceptions=True)


def _prune_weights(cl: Cluster, version: int, keep: int) -> None:
    """Keep the published weight directories of the newest ``keep`` versions (every engine has
    reloaded ``version`` by now, and a returning cell starts on the newest)."""
    for p in Path(cl.rundir.weights).glob("v*"):
        try:
            v = int(p.name[1:])
        except ValueError:
            continue
        if v <= version - keep and v not in cl._loading:
            shutil.rmtree(p, ignore_errors=True)
