"""The embedded engine's side of an in-memory publication: receive a bucket, check it, apply it.

Order matters for a collective: every tensor the request lists is received first, whatever
happens next, so the trainer's broadcasts never wait on an engine that has already decided
to refuse. Only then is anything checked (names, shapes, the delta's base, checksums), and
only a bucket that passes every check is copied into the model: a refused bucket leaves the
engine serving exactly the weights it had.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from gyre.engine import delta
from gyre.engine.protocol import UpdateWeightsFromDistributedRequest

if TYPE_CHECKING:
    import torch

    from gyre.engine.weight_group import WeightGroup


class NeedsFullCopy(Exception):
    """The engine does not hold the delta's base: it needs the tensors themselves."""


class BucketRefused(Exception):
    """A bucket that does not fit this model (names, shapes) or fails its checksums."""


def torch_dtype(name: str) -> torch.dtype:
    import torch

    dt = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise BucketRefused(f"unknown dtype {name!r}")
    return dt


def receive(
    group: WeightGroup, req: UpdateWeightsFromDistributedRequest, device: str
) -> list[torch.Tensor]:
    """Every broadcast of the bucket, in order (blocking: the worker thread calls it)."""
    import torch

    out = []
    for i, (dt, shape) in enumerate(zip(req.dtypes, req.shapes)):
        if req.encoding == "raw":
            t = torch.empty(shape, dtype=torch_dtype(dt), device=device)
        else:
            assert req.nbytes is not None  # the request's validator guarantees it
            t = torch.empty(req.nbytes[i], dtype=torch.uint8, device=device)
        out.append(group.broadcast(t))
    return out


def decode_bucket(
    params: dict[str, torch.Tensor],
    held: dict[str, int],
    req: UpdateWeightsFromDistributedRequest,
    got: list[torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The new value of each named tensor, checked; :class:`NeedsFullCopy` when a delta's base
    is not what this engine holds, :class:`BucketRefused` (or :class:`delta.DeltaError`) else."""
    unknown = [n for n in req.names if n not in params]
    if unknown:
        raise BucketRefused(f"unknown parameter names {unknown[:5]}")
    for n, shape in zip(req.names, req.shapes):
        if list(params[n].shape) != list(shape):
            raise BucketRefused(
                f"{n}: shape {list(shape)} but the model's is {list(params[n].shape)}"
            )
    if req.encoding == "raw":
        out = dict(zip(req.names, got))
        if req.checksums is not None:
            for (n, t), want in zip(out.items(), req.checksums):
                if delta.checksum(t) != want:
                    raise delta.DeltaError(f"{n}: checksum mismatch of the received tensor")
        return out
    assert req.checksums is not None and req.base_version is not None
    stale = [n for n in req.names if held.get(n) != req.base_version]
    if stale:
        n = stale[0]
        raise NeedsFullCopy(
            f"{len(stale)} tensors (first {n}, held at version {held.get(n)}) are not at the "
            f"delta's base version {req.base_version}; send a full copy"
        )
    for n, dt in zip(req.names, req.dtypes):
        if params[n].dtype != torch_dtype(dt):
            raise NeedsFullCopy(
                f"{n} is held in {params[n].dtype}, the delta is of {dt}; send a full copy"
            )
    sums = req.checksums

    def one(i: int) -> torch.Tensor:
        n = req.names[i]
        return delta.decode(got[i].cpu().numpy().data, params[n].cpu(), n, sums[i])

    # zlib and torch's byte ops release the GIL: tensors decode in parallel
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        return dict(zip(req.names, pool.map(one, range(len(req.names)))))


def apply(params: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> None:
    import torch

    with torch.no_grad():
        for n, t in new.items():
            params[n].copy_(t.to(params[n].device, params[n].dtype))
