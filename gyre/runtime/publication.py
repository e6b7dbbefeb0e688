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
"""

from __future__ import annotations

import asyncio
from typing import Any

from gyre.engine.protocol import ModelInfo, UpdateWeightsResponse


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
