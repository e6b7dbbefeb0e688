"""Publishing weights to engines in memory: SGLang's ``update_weights_from_distributed`` protocol.

The trainer (rank 0) and the engines (ranks 1..N) form one process group
(:class:`~gyre.engine.weight_group.WeightGroup`, gloo on CPU, NCCL on GPU). A publication is a
few buckets; for each, every engine gets one HTTP request naming the bucket's tensors (names,
dtypes, shapes) and then receives them by broadcast. A real SGLang server speaks the same two
routes, so it is a drop-in on GPU; the embedded engine implements them on CPU over gloo.

Deltas (:mod:`gyre.engine.delta`): once every engine of the group is known to hold the previous
publication (it acknowledged it, and it holds the weights in the dtype they are published in,
which only a Gyre engine reports), a publication sends XOR-shuffle-zlib deltas with a CRC-32 per
tensor instead of the tensors. An engine that missed a version answers ``needs_full_copy`` and
the publication is sent again in full (the channel keeps the newest full copy: it is the base of
the next delta anyway). Disk (:func:`gyre.train.checkpoint.write_hf`) stays the path of an
engine that starts later: it loads the newest published directory, then joins a new group.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal

import torch

from gyre.engine import delta
from gyre.engine.client import EngineClient
from gyre.engine.protocol import InitWeightsUpdateGroupRequest, UpdateWeightsFromDistributedRequest
from gyre.engine.weight_group import WeightGroup
from gyre.ports import free_ports

BUCKET_BYTES = 256 << 20
"""Payload bytes per bucket (one HTTP request per engine each): SGLang's and slime's order of
magnitude; it bounds the engine's receive buffer, not the trainer's."""


class WeightSyncError(RuntimeError):
    """An engine could not join the group or refused a publication (the message names it)."""


@dataclass
class Item:
    """One tensor as it goes over the wire: raw, or a delta payload."""

    name: str
    dtype: str
    shape: list[int]
    payload: torch.Tensor
    checksum: str


@dataclass
class PublishStats:
    version: int
    encoding: str
    raw_bytes: int  # the tensors' own bytes
    payload_bytes: int  # what was broadcast (to each engine), full re-sends included
    buckets: int
    encode_s: float
    seconds: float
    full_resends: int = 0
    replies: list = field(default_factory=list)


def encode_items(
    params: dict[str, torch.Tensor], base: dict[str, torch.Tensor] | None
) -> list[Item]:
    """Each tensor raw (``base`` None) or as the delta from ``base``, with its checksum; tensors
    in parallel (zlib and torch's byte ops release the GIL)."""

    def one(n: str) -> Item:
        t = params[n].detach().to("cpu").contiguous()
        dt = str(t.dtype).removeprefix("torch.")
        if base is None:
            payload = t
        else:
            payload = torch.frombuffer(bytearray(delta.encode(t, base[n])), dtype=torch.uint8)
        return Item(n, dt, list(t.shape), payload, delta.checksum(t))

    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        return list(pool.map(one, params))


def buckets(items: list[Item], limit: int) -> list[list[Item]]:
    """Consecutive items up to ``limit`` payload bytes each (one item larger than it goes alone)."""
    out: list[list[Item]] = [[]]
    size = 0
    for it in items:
        n = it.payload.numel() * it.payload.element_size()
        if out[-1] and size + n > limit:
            out.append([])
            size = 0
        out[-1].append(it)
        size += n
    return [b for b in out if b]


class DistributedWeightChannel:
    """Rank 0 of a weight-update group with the engines at ``urls`` (call from an event loop)."""

    def __init__(
        self,
        urls: list[str],
        *,
        api_key: str | None = None,
        master_address: str = "127.0.0.1",
        backend: str = "gloo",
        device: str = "cpu",
        bucket_bytes: int = BUCKET_BYTES,
        use_delta: bool = True,
        timeout_s: float = 600.0,
    ):
        self.urls, self.api_key = list(urls), api_key
        self.master_address, self.backend, self.device = master_address, backend, device
        self.bucket_bytes, self.use_delta, self.timeout_s = bucket_bytes, use_delta, timeout_s
        self.group_name = f"gyre-weights-{uuid.uuid4().hex[:8]}"
        self.group: WeightGroup | None = None
        self.port: int | None = None  # where rank 0's store listens (master_address only)
        self.delta_ok = False  # every engine holds the published dtype exactly (set at connect)
        self.acked: dict[str, int | None] = {}  # url -> the version it is known to hold
        self._base: dict[str, torch.Tensor] | None = None  # the newest full copy published
        self._base_version: int | None = None
        self._sessions: list[str] = []  # engines that receive inside begin/end_weight_update

    def _client(self, url: str) -> EngineClient:
        return EngineClient(url, api_key=self.api_key)

    async def connect(self) -> None:
        """Open the group: rank 0 here, engine ``i`` as rank ``i + 1`` (all at once: the
        rendezvous waits for every member)."""
        await self._check_kinds()
        (port,) = free_ports(host=self.master_address)
        self.port = port
        world = len(self.urls) + 1
        opening = asyncio.to_thread(
            WeightGroup,
            self.master_address,
            port,
            0,
            world,
            self.group_name,
            self.backend,
            self.timeout_s,
        )

        async def join(i: int, url: str):
            req = InitWeightsUpdateGroupRequest(
                master_address=self.master_address,
                master_port=port,
                rank_offset=i + 1,
                world_size=world,
                group_name=self.group_name,
                backend=self.backend,
            )
            async with self._client(url) as c:
                return await c.init_weights_update_group(req), await c.model_info()

        group, *joined = await asyncio.gather(
            opening, *[join(i, u) for i, u in enumerate(self.urls)]
        )
        for url, (resp, _) in zip(self.urls, joined):
            if not resp.success:
                raise WeightSyncError(f"engine {url} did not join the weight group: {resp.message}")
        self.group = group
        infos = [info for _, info in joined]
        self.acked = {u: _int(i.weight_version) for u, i in zip(self.urls, infos)}
        self.delta_ok = self.use_delta and all(
            i.engine_kind == "embedded" and i.weights_dtype is not None for i in infos
        )
        self._dtypes = {i.weights_dtype for i in infos}
        # a real SGLang (no engine_kind) receives only inside a begin/end weight-update session
        self._sessions = [u for u, i in zip(self.urls, infos) if i.engine_kind is None]

    async def _check_kinds(self) -> None:
        """Refuse at once an engine that cannot join (a Gyre engine other than the embedded one):
        rank 0's rendezvous would otherwise wait for it until its timeout."""

        async def kind(url: str) -> str | None:
            async with self._client(url) as c:
                return (await c.model_info()).engine_kind

        kinds = await asyncio.gather(*[kind(u) for u in self.urls])
        bad = [f"{u} ({k})" for u, k in zip(self.urls, kinds) if k not in (None, "embedded")]
        if bad:
            raise WeightSyncError(
                f"engines {', '.join(bad)} do not receive weights in memory; publish through disk"
            )

    async def close(self) -> None:
        async def leave(url: str) -> None:
            async with self._client(url) as c:
                await c.destroy_weights_update_group(self.group_name)

        await asyncio.gather(*[leave(u) for u in self.urls], return_exceptions=True)
        if self.group is not None:
            self.group.close()
            self.group = None

    def _delta_base(self, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
        """The base of a delta to every engine, or None (send the tensors)."""
        base, v = self._base, self._base_version
        if not self.delta_ok or base is None or set(base) != set(params):
            return None
        if any(str(t.dtype).removeprefix("torch.") not in self._dtypes for t in params.values()):
            return None  # an engine holds another dtype than the published one: no exact base
        if any(self.acked.get(u) != v for u in self.urls):
            return None  # an engine missed a version: everyone gets the full copy
        return base

    async def publish(self, version: int, params: dict[str, torch.Tensor]) -> PublishStats:
        """Send version ``version`` of ``params`` to every engine of the group."""
        if self.group is None:
            raise WeightSyncError("the weight group is not open: call connect() first")
        t0 = time.perf_counter()
        base = self._delta_base(params)
        items = await asyncio.to_thread(encode_items, params, base)
        encoding = "raw" if base is None else delta.CODEC
        t_enc = time.perf_counter() - t0
        stats = PublishStats(version, encoding, _nbytes(params), 0, 0, t_enc, 0.0)
        await self._session_step("begin")
        try:
            refused = await self._send_all(items, version, encoding, stats)
            if refused:  # an engine missed a version: seed everyone from the full copy
                stats.full_resends += 1
                items = await asyncio.to_thread(encode_items, params, None)
                refused = await self._send_all(items, version, "raw", stats)
                if refused:
                    raise WeightSyncError(
                        f"engines {refused} refused a full copy of version {version}"
                    )
        except BaseException:
            await self._session_step("end", strict=False)  # the first error is the one to see
            raise
        await self._session_step("end")
        self._base = {n: t.detach().to("cpu").clone() for n, t in params.items()}
        self._base_version = version
        stats.seconds = time.perf_counter() - t0
        return stats

    async def _session_step(self, step: Literal["begin", "end"], strict: bool = True) -> None:
        """Open or close SGLang's weight-update session on the engines that need one."""

        async def one(url: str) -> None:
            async with self._client(url) as c:
                await c.weight_update_session(step)

        got = await asyncio.gather(*[one(u) for u in self._sessions], return_exceptions=True)
        bad = [f"{u}: {e}" for u, e in zip(self._sessions, got) if isinstance(e, BaseException)]
        if bad and strict:
            raise WeightSyncError(f"{step}_weight_update failed on {'; '.join(bad)}")

    async def _send_all(
        self, items: list[Item], version: int, encoding: str, stats: PublishStats
    ) -> list[str]:
        """Every bucket to every engine; the URLs that need a full copy."""
        needs_full: set[str] = set()
        for bucket in buckets(items, self.bucket_bytes):
            replies = await self._send_bucket(bucket, version, encoding)
            stats.buckets += 1
            stats.payload_bytes += sum(
                it.payload.numel() * it.payload.element_size() for it in bucket
            )
            for url, r in zip(self.urls, replies):
                if r.needs_full_copy:
                    needs_full.add(url)
                elif not r.success:
                    raise WeightSyncError(f"engine {url} refused version {version}: {r.message}")
            stats.replies = replies
        for url in self.urls:
            self.acked[url] = None if url in needs_full else version
        return sorted(needs_full)

    async def _send_bucket(self, bucket: list[Item], version: int, encoding: str) -> list:
        req = UpdateWeightsFromDistributedRequest(
            names=[it.name for it in bucket],
            dtypes=[it.dtype for it in bucket],
            shapes=[it.shape for it in bucket],
            group_name=self.group_name,
            weight_version=str(version),  # SGLang's type; Gyre engines read it as an int
            encoding=encoding,  # type: ignore[arg-type]  # a DeltaCodec literal
            base_version=self._base_version if encoding != "raw" else None,
            nbytes=[it.payload.numel() for it in bucket] if encoding != "raw" else None,
            checksums=[it.checksum for it in bucket] if self.delta_ok else None,
        )

        async def post(url: str):
            async with self._client(url) as c:
                return await c.update_weights_from_distributed(req)

        posts = [asyncio.ensure_future(post(u)) for u in self.urls]
        group = self.group
        assert group is not None
        dev = self.device

        def send() -> None:
            for it in bucket:
                group.broadcast(it.payload.to(dev))

        sent = asyncio.to_thread(send)
        _, *replies = await asyncio.gather(sent, *posts)
        return replies


def _nbytes(params: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in params.values())


def _int(v: int | str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None
