"""KV migration: a request's K/V cache and sampling state leave one embedded engine for another.

Why: when a rollout cell switches to training, the proxy moves each of its live calls to another
engine with the tokens generated so far (:mod:`gyre.proxy.pool`). Without this the new engine
prefills that whole context again, seconds at 2K-8K tokens on CPU; with it the new engine
imports the K/V of those tokens and runs only the one token that was sampled but not yet fed.

The flow (proxy-driven, over each engine's HTTP API; the same calls work in process):

1. ``/abort_request {"rid", "keep_kv": true}``: at the next step boundary the engine takes the
   row out of its batch, keeps its K/V (the real columns, left pad dropped) and its generator
   state *parked* under the rid, then finishes the request with ``abort`` and the tokens so far.
   Parked at a boundary, never mid-step: the parked state is exactly the state the client's
   tokens came from (a step in flight when the abort arrived finishes first, its token is
   part of the answer).
2. ``/kv_export {"rid", "weight_version"}``: the parked entry as bytes (:func:`encode`), or 404
   (nothing parked: the request was still queued) or 409 (its K/V was computed under other
   weights than ``weight_version``, the target's: never migrated, see below).
3. ``/kv_import?rid=NEW`` with those bytes: the target checks the layout (layers, heads,
   head size, dtype), the weights (version and checksum: K/V computed under other weights must
   not be reused) and its room (``kv_migration_mb``), then keeps the entry for rid ``NEW``.
4. ``/generate`` with rid ``NEW`` and input = prompt + output so far: the row is admitted with
   the imported K/V (the tokens it covers must start the input) and the imported generator, and
   prefills only the rest (one token). The continuation's tokens and log-probs are bit-identical
   to an unswitched engine's under the same seed and batch composition.

Any refusal is a fallback, never an error: the proxy then re-prefills as before.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gyre.engine.base import KVRefused

if TYPE_CHECKING:
    from gyre.engine.batch import DecodeBatch, Row

MAGIC = b"GYKV1"
PARK_TTL_S = 60.0
"""A parked or imported entry nobody claims within this long is dropped (its proxy died)."""


@dataclass
class KVPacket:
    """One request's K/V and sampling state, as it leaves an engine."""

    tokens: list[int]  # the token ids whose K/V these are (a prefix of the continuation's input)
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, [1, H, n, D] each, contiguous
    kv_version: int  # weights version every column was computed under
    weights_checksum: float | None
    weights_dtype: str | None = None  # the engine's layout_name: K/V dtype follows compute dtype
    generator_state: bytes | None = None  # torch.Generator state (None: greedy)
    made_s: float = field(default_factory=time.monotonic)

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)

    def layout(self) -> dict[str, Any]:
        k = self.kv[0][0] if self.kv else None
        return {
            "layers": len(self.kv),
            "heads": None if k is None else int(k.shape[1]),
            "head_dim": None if k is None else int(k.shape[3]),
            "dtype": None if k is None else str(k.dtype).removeprefix("torch."),
        }


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """K and V, every layer: what one token of context costs to move."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes


# -- the wire: a length-prefixed JSON header, then the raw tensor bytes, layer by layer -----------
def encode(p: KVPacket) -> memoryview:
    """The packet as one buffer; each tensor is copied once, straight into it (a 377 MB packet,
    SmolLM2 at 8K tokens, is not copied again by joining pieces)."""
    head = dict(
        p.layout(),
        n=len(p.tokens),
        kv_version=p.kv_version,
        weights_checksum=p.weights_checksum,
        weights_dtype=p.weights_dtype,
        gen=len(p.generator_state) if p.generator_state is not None else None,
    )
    hb = json.dumps(head).encode()
    parts = [MAGIC, struct.pack("<I", len(hb)), hb, np.asarray(p.tokens, dtype=np.int64).tobytes()]
    if p.generator_state is not None:
        parts.append(p.generator_state)
    front = b"".join(parts)
    out = bytearray(len(front) + p.nbytes)
    out[: len(front)] = front
    at = len(front)
    for pair in p.kv:
        for t in pair:
            n = t.numel() * t.element_size()
            dst = torch.frombuffer(out, dtype=torch.uint8, count=n, offset=at)
            dst.copy_(t.contiguous().view(-1).view(torch.uint8))
            at += n
    return memoryview(out)


def decode(data: bytes | bytearray | memoryview) -> KVPacket:
    """A packet from :func:`encode`'s bytes; the tensors are views of one writable copy."""
    buf = memoryview(data if isinstance(data, bytearray) else bytearray(data))
    if bytes(buf[: len(MAGIC)]) != MAGIC:
        raise KVRefused("format", "not a Gyre K/V packet (bad magic)")
    at = len(MAGIC)
    (hl,) = struct.unpack_from("<I", buf, at)
    at += 4
    head = json.loads(bytes(buf[at : at + hl]))
    at += hl
    n = int(head["n"])
    tokens = np.frombuffer(buf, dtype=np.int64, count=n, offset=at).tolist()
    at += 8 * n
    gen = None
    if head.get("gen") is not None:
        gen = bytes(buf[at : at + int(head["gen"])])
        at += int(head["gen"])
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    if head["layers"]:
        dtype = getattr(torch, head["dtype"])
        shape = (1, int(head["heads"]), n, int(head["head_dim"]))
        size = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        if at + 2 * size * int(head["layers"]) != len(buf):
            raise KVRefused("format", f"K/V packet of {len(buf)} bytes does not match its header")
        for _ in range(int(head["layers"])):
            pair = []
            for _ in range(2):
                raw = torch.frombuffer(buf, dtype=torch.uint8, count=size, offset=at)
                pair.append(raw.view(dtype).view(shape))
                at += size
            kv.append((pair[0], pair[1]))
    if at != len(buf):
        raise KVRefused("format", f"K/V packet of {len(buf)} bytes, {at} expected")
    return KVPacket(
        tokens=tokens,
        kv=kv,
        kv_version=int(head["kv_version"]),
        weights_checksum=head.get("weights_checksum"),
        weights_dtype=head.get("weights_dtype"),
        generator_state=gen,
    )


# -- worker side (the engine's one worker thread) ---------------------------------------------------
def take_row(batch: DecodeBatch, rid: str, checksum: float | None) -> KVPacket | None:
    """Take request ``rid`` out of ``batch`` with its K/V and generator state (None: it has no
    K/V yet). A row whose K/V began under older weights than the batch's (an in-place weights
    update mid-request) has mixed K/V: parked with version -1, which no engine accepts."""
    packet = None
    for i, r in enumerate(batch.rows):
        if r.rid == rid:
            lo = batch.width - r.n_cached  # left-padded: the real columns are the last n_cached
            kv = [
                (
                    layer.keys[i : i + 1, :, lo:, :].clone(),
                    layer.values[i : i + 1, :, lo:, :].clone(),
                )
                for layer in batch.cache.layers
            ]
            packet = _packet(r, r.fed[: r.n_cached], kv, batch.version, checksum)
            break
    else:
        for p in batch.pending:  # a prefill cut short: the chunks done so far move
            if p.row.rid == rid and p.done > 0:
                kv = [
                    (layer.keys[:, :, : p.done].clone(), layer.values[:, :, : p.done].clone())
                    for layer in p.cache.layers
                ]
                packet = _packet(p.row, p.ids[: p.done], kv, batch.version, checksum)
                break
    batch.remove({rid})
    return packet


def _packet(
    row: Row, tokens: list[int], kv: list, version: int, checksum: float | None
) -> KVPacket:
    gen = row.generator
    return KVPacket(
        tokens=list(tokens),
        kv=kv,
        kv_version=row.kv_version if row.kv_version == version else -1,
        weights_checksum=checksum,
        generator_state=None if gen is None else gen.get_state().numpy().tobytes(),
    )


def admit_imported(batch: DecodeBatch, row: Row, input_ids: list[int], p: KVPacket) -> bool:
    """Queue ``row``'s prefill seeded with the imported K/V; False (nothing done) when the K/V no
    longer fits: the weights changed since the import, or its tokens do not start the input."""
    from gyre.engine.batch import Prefill

    n = len(p.tokens)
    if p.kv_version != batch.version or not 0 < n < len(input_ids) or input_ids[:n] != p.tokens:
        return False
    cache = batch._new_cache()
    for i, (k, v) in enumerate(p.kv):
        cache.update(k.to(batch.device), v.to(batch.device), i)
    row.fed = list(input_ids)
    row.kv_version = batch.version
    batch.pending.append(Prefill(row=row, ids=list(input_ids), cache=cache, done=n, cached=n))
    return True


def restore_generator(row: Row, p: KVPacket) -> None:
    """The row samples on from where the source engine's generator stopped."""
    if row.generator is not None and p.generator_state is not None:
        state = torch.frombuffer(bytearray(p.generator_state), dtype=torch.uint8)
        row.generator.set_state(state)


# -- the engine's store of parked (outgoing) and imported (incoming) entries --------------------------
class KVStore:
    """Entries by rid under a byte budget; entries older than :data:`PARK_TTL_S` are dropped."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.entries: dict[str, KVPacket] = {}
        self.bytes = 0

    def sweep(self) -> None:
        now = time.monotonic()
        for rid in [r for r, p in self.entries.items() if now - p.made_s > PARK_TTL_S]:
            self.pop(rid)

    def room_for(self, nbytes: int) -> bool:
        self.sweep()
        return self.bytes + nbytes <= self.max_bytes

    def put(self, rid: str, p: KVPacket) -> None:
        self.pop(rid)
        self.entries[rid] = p
        self.bytes += p.nbytes

    def pop(self, rid: str) -> KVPacket | None:
        p = self.entries.pop(rid, None)
        if p is not None:
            self.bytes -= p.nbytes
        return p
