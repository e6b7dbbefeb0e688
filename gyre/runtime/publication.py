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

:class:`Publications` is the driver's side of a publication (``Cluster.publish`` gives it the
engines): the core writes the directory, every rollout engine pauses, reloads (or receives it
in memory) and continues, each is checked, and published directories past
``run.keep_published`` are pruned. It is also where an engine starts on the newest weights and
catches up with a publication that ran meanwhile (a cell's and a standalone engine's alike).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import ray

from gyre.engine.client import EngineClient, EngineError
from gyre.engine.protocol import ModelInfo, UpdateWeightsResponse
from gyre.runtime.rundir import tree_bytes

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
        except BaseException:  # broad on purpose: any end of the send (error or cancel) leaves
            self.channel, self.urls = None, ()  # the group unusable: the next starts fresh
            raise
        return {
            "replies": stats.replies,
            "encoding": stats.encoding,
            "bytes": stats.payload_bytes,
            "raw_bytes": stats.raw_bytes,
            "full_resends": stats.full_resends,
        }


class Publications:
    """The published weights and everything that reads or changes them: which directory and
    version are newest, their fingerprints, the publication under way (an event engines that
    start meanwhile wait on), the versions engines are still loading (never pruned), and the
    one loop that starts an engine on the newest weights and catches it up. The cluster
    composes one; a failed engine is returned to it, never called back."""

    def __init__(
        self,
        root: Path,
        weights_dir: str,
        version: int,
        engine_key: str,
        *,
        keep: int,
        in_memory: bool,
    ) -> None:
        self.root = root  # the run's weights/ folder: v<version> directories
        self.dir = weights_dir  # newest published weights (HF layout)
        self.version = version
        self.sums: dict[str, float] | None = None  # the core's fingerprints of ``dir``
        self.checked = 0  # engine loads found serving the published weights
        self.in_memory = 0  # engine loads of a publication sent in memory
        self.engine_key = engine_key
        self.keep = keep
        self.send_in_memory = in_memory
        self._under_way: asyncio.Event | None = None
        # versions engines are starting on, counted (a cell killed mid-start and its restarted
        # actor may load the same one at once): not pruned while any load holds them
        self._loading: Counter[int] = Counter()

    def begin(self) -> None:
        """Mark a publication as under way before anything else of the same boundary runs, so
        an engine starting at that boundary starts on the new version, not the old one."""
        if self._under_way is None:
            self._under_way = asyncio.Event()

    async def settled(self) -> None:
        """Return once no publication is under way."""
        while self._under_way is not None:
            await self._under_way.wait()

    async def publish(
        self,
        version: int,
        urls: list[str],
        save: Callable[[str], Awaitable[dict[str, float]]],
        send: Callable[[int, list[str]], Awaitable[dict[str, Any]]],
        name: Callable[[str], str],
    ) -> tuple[dict[str, Any], list[tuple[str, BaseException]]]:
        """The core writes version ``version`` (``save``: its fingerprints); every engine at
        ``urls`` pauses, reloads it (or gets it in memory by ``send``), continues, and is
        checked (``name``: how an error names it). Returns the publication's record and the
        engines that failed to take it, with why."""
        self.begin()
        under_way = self._under_way
        assert under_way is not None  # begin made it; only this method clears it
        try:
            t0 = time.perf_counter()
            path = str(self.root / f"v{version}")
            sums = await save(path)
            t_save = time.perf_counter() - t0
            self.dir, self.version, self.sums = path, version, sums

            async def reload(url: str) -> Any:
                async with EngineClient(url, api_key=self.engine_key) as c:
                    await c.pause()
                    try:
                        return await c.update_weights_from_disk(path, weight_version=version)
                    finally:
                        await c.resume()

            info: dict[str, Any] = {}
            results = await self._in_memory(version, urls, send, info)
            if results is None:  # run.publication = "disk", or the in-memory path failed
                results = await asyncio.gather(*[reload(u) for u in urls], return_exceptions=True)
            checked = 0
            failed: list[tuple[str, BaseException]] = []
            for u, r in zip(urls, results):
                if isinstance(r, BaseException):
                    failed.append((u, r))
                else:  # it reloaded: does it serve what the core wrote?
                    checked += self.check(name(u), r)
            self.prune(version, self.keep)
            return {
                "engines": len(urls),
                "checked": checked,
                "save_seconds": t_save,
                **info,
            }, failed
        finally:
            under_way.set()
            self._under_way = None

    def check(self, engine: str, reply: UpdateWeightsResponse | ModelInfo) -> bool:
        """:func:`check_served` against the newest publication, counted in ``checked``."""
        assert self.sums is not None, "nothing published yet"
        ok = check_served(engine, self.version, reply, self.sums)
        self.checked += ok
        return ok

    async def _in_memory(
        self,
        version: int,
        urls: list[str],
        send: Callable[[int, list[str]], Awaitable[dict[str, Any]]],
        info: dict,
    ) -> list | None:
        """``run.publication = "distributed"``: the core sends ``version`` to ``urls`` over a
        weight group (engines paused meanwhile); their replies (what was sent goes in
        ``info``), or None to reload from disk."""
        if not self.send_in_memory or not urls:
            return None
        clients = [EngineClient(u, api_key=self.engine_key) for u in urls]
        try:
            await asyncio.gather(*[c.pause() for c in clients])
            sent = await send(version, urls)
            self.in_memory += len(urls)
            info["memory"] = {k: v for k, v in sent.items() if k != "replies"}
            return sent["replies"]
        # the fallback, every engine reloading the directory just written, for what an in-memory
        # send is expected to fail with: an engine's error, the weight group's (RuntimeError),
        # a connection, or the core's call (Ray)
        except (EngineError, httpx.HTTPError, OSError, RuntimeError, ray.exceptions.RayError) as e:
            log.warning("in-memory publication of v%d failed (%s); reloading from disk", version, e)
            return None
        finally:
            await asyncio.gather(*[c.resume() for c in clients], return_exceptions=True)
            await asyncio.gather(*[c.aclose() for c in clients], return_exceptions=True)

    async def start_on_newest(self, start: Callable[[str, int], Awaitable[str]]) -> str:
        """Start an engine on the newest published weights (``start(dir, version)``: its URL).
        An engine restarted after a fault starts at any time, not only at a boundary: a
        publication may run while it starts, so the version it loads is kept from pruning, and
        it catches up (reloads) until it serves the newest."""
        version = self.version
        self._loading[version] += 1
        try:
            url = await start(self.dir, version)
            while version != self.version or self._under_way is not None:
                if self._under_way is not None:
                    await self._under_way.wait()
                    continue
                self._loading -= Counter({version: 1})  # drops it at 0
                version = self.version
                self._loading[version] += 1
                async with EngineClient(url, api_key=self.engine_key) as c:
                    await c.update_weights_from_disk(self.dir, weight_version=version)
            return url
        finally:
            self._loading -= Counter({version: 1})

    @property
    def loading(self) -> bool:
        """Whether any engine is still starting on a published version."""
        return bool(+self._loading)

    def _published(self) -> dict[int, Path]:
        """Each published weight directory under the root, by its version (``v<N>``; a
        ``v<N>.tmp`` still being written is none)."""
        out = {}
        for p in Path(self.root).glob("v*"):
            try:
                out[int(p.name[1:])] = p
            except ValueError:
                continue
        return out

    def prune(self, version: int, keep: int) -> int:
        """Keep the published weight directories of the newest ``keep`` versions (every engine
        has reloaded ``version`` by now, and a returning one starts on the newest); the bytes
        removed."""
        freed = 0
        for v, p in self._published().items():
            if v <= version - keep and v not in self._loading:
                freed += tree_bytes(p)
                shutil.rmtree(p, ignore_errors=True)
        return freed

    def keep_final(self) -> int:
        """At the end of a run: only the newest published directory stays (the final weights
        as an HF directory a user can serve); the bytes removed."""
        newest = max(self._published(), default=None)
        return 0 if newest is None else self.prune(newest, 1)
