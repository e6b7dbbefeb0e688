"""The weights fingerprint and the publication check's rule (pure parts)."""

from __future__ import annotations

import pytest
import torch

from gyre.engine.checksum import fingerprints, weights_checksum
from gyre.engine.protocol import ModelInfo, UpdateWeightsResponse
from gyre.runtime.publication import PublicationError, check_served


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.Linear(300, 7))


def test_fingerprint_sees_a_step_a_swap_and_a_dtype():
    m = _model()
    base = weights_checksum(m)
    assert weights_checksum(_model()) == base  # same values: bit-equal
    with torch.no_grad():
        m[0].weight.add_(1e-6)  # a step of about lr 1e-6 on one tensor
    assert weights_checksum(m) != base
    sq = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    before = weights_checksum(sq)
    with torch.no_grad():  # the two weight matrices exchanged: same values, other places
        w0 = sq[0].weight.clone()
        sq[0].weight.copy_(sq[1].weight)
        sq[1].weight.copy_(w0)
    assert weights_checksum(sq) != before
    # an engine holding bfloat16 weights reports what the core's bfloat16 fingerprint says
    m16 = _model().to(torch.bfloat16)
    assert weights_checksum(m16) == fingerprints(_model())["bfloat16"]
    assert fingerprints(_model())["float32"] != fingerprints(_model())["bfloat16"]


class _Tied(torch.nn.Module):
    """An embedding and a head that share one weight, as SmolLM2's do."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.embed = torch.nn.Embedding(50, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight


def test_a_bf16_serving_engine_matches_the_cores_mixed_fingerprint():
    """The embedded engine's compute_dtype='bfloat16' holds its linears (the untied head too)
    in bfloat16 and the rest in float32: the core's 'float32+bfloat16-linear' fingerprint of
    its float32 weights is what that engine reports, and no other layout is."""
    from gyre.engine.checksum import layout_name
    from gyre.engine.precision import to_compute_dtype

    assert layout_name("float32", "bfloat16") == "float32+bfloat16-linear"
    assert layout_name("float32", "float32") == "float32"
    for make in (_Tied, _model):
        want = fingerprints(make())
        served = to_compute_dtype(make(), "bfloat16")
        assert weights_checksum(served) == want["float32+bfloat16-linear"]
        assert weights_checksum(served) != want["float32"]
        assert weights_checksum(to_compute_dtype(make(), "float32")) == want["float32"]
    served = to_compute_dtype(_Tied(), "bfloat16")  # the head untied into its own bf16 copy
    assert weights_checksum(served) != fingerprints(_Tied())["bfloat16"]  # not all bf16
    assert served.head.weight is not served.embed.weight
    assert served.embed.weight.dtype == torch.float32


def test_check_served():
    sums = {"float32": 1.5, "bfloat16": 1.25}
    ok = UpdateWeightsResponse(success=True, weight_version=3, weights_checksum=1.5)
    assert check_served("cell 1's engine", 3, ok, sums) is True
    bf = ModelInfo(
        model_path="m", weight_version=3, weights_checksum=1.25, weights_dtype="bfloat16"
    )
    assert check_served("cell 1's engine", 3, bf, sums) is True
    # no fingerprint (vLLM, SGLang): not checkable, not an error
    assert (
        check_served("x", 3, UpdateWeightsResponse(success=True, weight_version=3), sums) is False
    )
    stale = UpdateWeightsResponse(success=True, weight_version=3, weights_checksum=1.0)
    with pytest.raises(PublicationError, match=r"cell 2's engine .* version 3 .*stopping the run"):
        check_served("cell 2's engine", 3, stale, sums)
    wrong_version = UpdateWeightsResponse(success=True, weight_version=2, weights_checksum=1.5)
    with pytest.raises(PublicationError, match="reports weights version 2"):
        check_served("cell 2's engine", 3, wrong_version, sums)


def test_two_starts_on_one_version_keep_it_from_pruning_until_both_end(tmp_path):
    """A cell killed while its engine starts and its restarted actor both load the newest
    version: the first start's end (it failed with its actor) must not let a publication prune
    the directory the second is still loading (seen in bench_chaos: "failed to start ... v3")."""
    import asyncio

    from gyre.runtime.publication import Publications

    for v in (3, 4, 5, 6):
        (tmp_path / f"v{v}").mkdir()
    gates = [asyncio.Event(), asyncio.Event()]
    calls: list[int] = []

    async def start_engine(weights_dir, version):
        i = len(calls)
        calls.append(version)
        await gates[i].wait()
        if i == 0:
            raise RuntimeError("the actor died")
        return "http://127.0.0.1:1"

    pubs = Publications(tmp_path, str(tmp_path / "v3"), 3, "key", keep=2, in_memory=False)

    async def scenario():
        first = asyncio.create_task(pubs.start_on_newest(start_engine))
        second = asyncio.create_task(pubs.start_on_newest(start_engine))
        await asyncio.sleep(0)
        gates[0].set()
        with pytest.raises(RuntimeError):
            await first
        pubs.prune(6, keep=2)  # a publication of v6 while the second still loads v3
        assert (tmp_path / "v3").is_dir()
        pubs.version = 3  # nothing newer was published meanwhile: no catch-up reload
        gates[1].set()
        assert await second == "http://127.0.0.1:1"
        assert not pubs.loading
        pubs.prune(6, keep=2)
        assert not (tmp_path / "v3").exists()

    asyncio.run(scenario())


def test_a_publication_returns_the_engines_that_failed_to_take_it(tmp_path):
    """An engine that cannot reload is handed back to the caller (the cluster decides whose
    loss it is), the publication still ends (an engine starting later does not wait on it) and
    the directories past ``keep`` are pruned."""
    import asyncio
    from pathlib import Path

    from gyre.runtime.publication import Publications

    (tmp_path / "v0").mkdir()
    pubs = Publications(tmp_path, str(tmp_path / "v0"), 0, "key", keep=1, in_memory=False)
    dead = "http://127.0.0.1:1"  # nothing listens there: the reload is refused

    async def save(path: str) -> dict[str, float]:
        Path(path).mkdir()
        return {"float32": 1.0}

    async def send(version: int, urls: list[str]) -> dict:
        raise AssertionError("run.publication = disk: nothing is sent in memory")

    async def scenario():
        info, failed = await pubs.publish(1, [dead], save, send, str)
        await asyncio.wait_for(pubs.settled(), 1)  # not under way any more
        return info, failed

    info, failed = asyncio.run(scenario())
    assert [u for u, _ in failed] == [dead] and isinstance(failed[0][1], Exception)
    assert info["engines"] == 1 and info["checked"] == 0
    assert (pubs.version, pubs.dir, pubs.sums) == (1, str(tmp_path / "v1"), {"float32": 1.0})
    assert sorted(p.name for p in tmp_path.glob("v*")) == ["v1"]


def test_at_the_end_only_the_final_published_weights_stay(tmp_path):
    """``keep_final``: every published directory but the newest goes (a directory an engine
    still loads stays), unfinished ``.tmp`` ones and other folders are not touched; the bytes
    removed are counted."""
    from gyre.runtime.publication import Publications

    for v in (4, 5, 7):
        (tmp_path / f"v{v}").mkdir()
        (tmp_path / f"v{v}" / "model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "v8.tmp").mkdir()
    (tmp_path / "snapshots").mkdir()
    pubs = Publications(tmp_path, str(tmp_path / "v7"), 7, "key", keep=2, in_memory=False)
    pubs._loading[4] += 1  # an engine still starting on v4
    assert pubs.keep_final() == 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshots", "v4", "v7", "v8.tmp"]
    assert Publications(tmp_path / "none", "", 0, "key", keep=2, in_memory=False).keep_final() == 0
