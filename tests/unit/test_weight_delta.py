"""Delta publication's codec and checks: bit-exact round trips, clear refusals."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from gyre.engine import delta
from gyre.engine.protocol import UpdateWeightsFromDistributedRequest
from gyre.engine.receive import BucketRefused, NeedsFullCopy, decode_bucket
from gyre.train.weight_sync import buckets, encode_items


def _moved(t: torch.Tensor, scale: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (t.float() + torch.randn(t.shape, generator=g) * scale).to(t.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("scale", [1e-5, 1e-2, 0.0])
def test_round_trip_is_bit_exact(dtype, scale):
    base = torch.randn(37, 129, generator=torch.Generator().manual_seed(1)).to(dtype)
    new = _moved(base, scale)
    new.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -0.0]).to(dtype)  # odd bits too
    out = delta.decode(delta.encode(new, base), base, "w", delta.checksum(new))
    assert out.dtype == dtype and out.shape == new.shape
    assert torch.equal(out.reshape(-1).view(torch.uint8), new.reshape(-1).view(torch.uint8))


def test_small_steps_compress_and_an_unchanged_tensor_is_nearly_free():
    base = torch.randn(256, 256)
    raw = base.numel() * 4
    assert len(delta.encode(_moved(base, 1e-5), base)) < 0.8 * raw
    assert len(delta.encode(base.clone(), base)) < 0.01 * raw


def test_a_wrong_base_or_a_corrupt_payload_is_refused_clearly():
    base = torch.randn(64, 64)
    new = _moved(base, 1e-3)
    payload = delta.encode(new, base)
    with pytest.raises(delta.DeltaError, match=r"w: checksum mismatch .* old weights are kept"):
        delta.decode(payload, _moved(base, 1e-3, seed=9), "w", delta.checksum(new))
    with pytest.raises(delta.DeltaError, match="does not decompress"):
        delta.decode(payload[: len(payload) // 2], base, "w", delta.checksum(new))
    with pytest.raises(delta.DeltaError, match="same dtype and shape"):
        delta.encode(new, base.double())


def _request(items, base_version):
    return UpdateWeightsFromDistributedRequest(
        names=[it.name for it in items],
        dtypes=[it.dtype for it in items],
        shapes=[it.shape for it in items],
        encoding="xor-shuffle-zlib",
        base_version=base_version,
        nbytes=[it.payload.numel() for it in items],
        checksums=[it.checksum for it in items],
    )


def test_decode_bucket_applies_only_from_the_held_base():
    held_params = {"a": torch.randn(8, 4), "b": torch.randn(3)}
    new = {n: _moved(t, 1e-3) for n, t in held_params.items()}
    items = encode_items(new, held_params)
    req = _request(items, base_version=4)
    got = decode_bucket(held_params, {"a": 4, "b": 4}, req, [it.payload for it in items])
    assert all(torch.equal(got[n], new[n]) for n in new)
    with pytest.raises(NeedsFullCopy, match="held at version 3.*base version 4; send a full copy"):
        decode_bucket(held_params, {"a": 4, "b": 3}, req, [it.payload for it in items])
    with pytest.raises(BucketRefused, match="unknown parameter names"):
        decode_bucket({"a": held_params["a"]}, {"a": 4}, req, [it.payload for it in items])


def test_buckets_keep_order_and_bound_the_payload():
    items = encode_items({f"t{i}": torch.zeros(10) for i in range(7)}, None)  # 40 bytes each
    got = buckets(items, 100)
    assert [[it.name for it in b] for b in got] == [
        ["t0", "t1"],
        ["t2", "t3"],
        ["t4", "t5"],
        ["t6"],
    ]
    assert [len(b) for b in buckets(items, 1)] == [1] * 7  # a tensor larger than the limit alone


def test_a_delta_request_needs_its_sizes_checksums_and_base():
    with pytest.raises(ValidationError, match="needs nbytes, checksums and base_version"):
        UpdateWeightsFromDistributedRequest(
            names=["a"], dtypes=["float32"], shapes=[[2]], encoding="xor-shuffle-zlib"
        )
    with pytest.raises(ValidationError, match="dtypes must have one entry per name"):
        UpdateWeightsFromDistributedRequest(names=["a", "b"], dtypes=["float32"], shapes=[[2], [2]])
