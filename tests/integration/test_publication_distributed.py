"""Weights in memory: two embedded engines (``gyre engine`` processes) receive the trainer's
weights over gloo through SGLang's two routes, then serve them.

What a disk reload of the same weights serves is the reference: the fingerprint and the greedy
tokens and log-probs must be the same. A delta publication is smaller than the tensors and
lands bit-exact (every tensor's CRC-32 is checked by the engine); an engine that missed a
version refuses the delta and is seeded from the full copy; a corrupted checksum is refused
with a clear error and the engine keeps serving its old weights.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from gyre.engine.checksum import weights_checksum
from gyre.engine.client import EngineClient
from gyre.engine.weight_group import WeightGroup
from gyre.ports import free_ports
from gyre.train import weight_sync
from gyre.train.weight_sync import DistributedWeightChannel, WeightSyncError
from gyre.train.weights import named_params

pytestmark = pytest.mark.slow  # two engine processes, ~50 s on 2 cores

PROMPT = [5, 17, 42, 8, 99, 3]


def _start_engine(model_dir: str, engine_id: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "gyre.cli", "engine", "--kind", "embedded", "--model", model_dir]
    cmd += ["--port", "0", "--engine-id", engine_id, "--torch-threads", "1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    m = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stderr.readline())
    assert m, "the engine CLI printed no URL"
    url, deadline = m.group(0), time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "engine never became healthy"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    started = [_start_engine(str(tiny_model_dir), f"mem-{i}") for i in range(2)]
    yield [u for _, u in started]
    for p, _ in started:
        p.terminate()
        p.wait(timeout=30)


@pytest.fixture(scope="module")
def trainer(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def _step(model: torch.nn.Module, scale: float, seed: int) -> None:
    """An optimizer-step-sized move of every parameter (relative ``scale``)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale * (p.abs().mean() + 1e-3))


def _listeners(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) listening on ``port``."""
    out = set()
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(f).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, _, p = local.rpartition(":")
            if state == "0A" and int(p, 16) == port:  # 0A: LISTEN
                out.add(addr)
    return out


async def _greedy(url: str) -> tuple[list[int], list[float], float | None]:
    async with EngineClient(url) as c:
        r = await c.generate(PROMPT, {"max_new_tokens": 8, "temperature": 0.0})
        info = await c.model_info()
    return r.output_ids, r.logprobs, info.weights_checksum


async def test_in_memory_publication_serves_what_a_disk_reload_serves(engines, trainer, tmp_path):
    mem, disk = engines
    before = await _greedy(mem)
    _step(trainer, 0.5, seed=1)  # large enough to change the greedy tokens
    ch = DistributedWeightChannel([mem])
    await ch.connect()
    try:
        assert ch.port is not None and _listeners(ch.port) == {"0100007F"}  # 127.0.0.1 only
        stats = await ch.publish(1, named_params(trainer))
    finally:
        await ch.close()
    assert stats.encoding == "raw" and stats.payload_bytes == stats.raw_bytes
    assert stats.replies[0].weights_checksum == weights_checksum(trainer)
    trainer.save_pretrained(tmp_path / "v1")
    async with EngineClient(disk) as c:
        await c.update_weights_from_disk(str(tmp_path / "v1"), weight_version=1)
    got, want = await _greedy(mem), await _greedy(disk)
    assert got[2] == want[2] != before[2]
    assert got[0] == want[0] and got[1] == want[1]  # same weights, same code: bit-equal
    assert got[:2] != before[:2]


async def test_delta_is_smaller_bit_exact_and_seeds_a_missed_engine(engines, trainer, tmp_path):
    ch = DistributedWeightChannel(engines)
    await ch.connect()  # both engines hold version 1 (previous test)
    try:
        first = await ch.publish(1, named_params(trainer))  # the channel's own full copy
        assert first.encoding == "raw"
        trainer.save_pretrained(tmp_path / "v1")
        _step(trainer, 1e-4, seed=2)
        v2 = await ch.publish(2, named_params(trainer))
        assert v2.encoding == "xor-shuffle-zlib" and v2.full_resends == 0
        assert v2.payload_bytes < 0.9 * v2.raw_bytes, (v2.payload_bytes, v2.raw_bytes)
        assert [r.weights_checksum for r in v2.replies] == [weights_checksum(trainer)] * 2
        # engine 1 misses version 2: it goes back to version 1's weights from disk
        async with EngineClient(engines[1]) as c:
            await c.update_weights_from_disk(str(tmp_path / "v1"), weight_version=1)
        _step(trainer, 1e-4, seed=3)
        v3 = await ch.publish(3, named_params(trainer))
        assert v3.full_resends == 1  # engine 1 refused the delta, everyone got the full copy
        assert [r.weights_checksum for r in v3.replies] == [weights_checksum(trainer)] * 2
        assert [r.weight_version for r in v3.replies] == [3, 3]
    finally:
        await ch.close()


def test_a_group_built_by_torchs_helper_as_sglang_does_meets_ours():
    """SGLang's engine joins with torch's ``_new_process_group_helper``; Gyre's rank 0 builds the
    group directly. The store keys and backends must line up, or a real server would hang."""
    (port,) = free_ports()
    member = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "torch_helper_member.py")]
        + ["127.0.0.1", str(port), "1", "2", "weights-x"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        group = WeightGroup("127.0.0.1", port, 0, 2, "weights-x", "gloo", timeout_s=60)
        sent = [torch.arange(12.0).reshape(3, 4), torch.linspace(-1, 1, 5).to(torch.bfloat16)]
        for t in sent:
            group.broadcast(t)
        out, _ = member.communicate(timeout=60)
    finally:
        if member.poll() is None:
            member.kill()
    assert json.loads(out) == [t.float().tolist() for t in sent]


async def test_an_engine_that_cannot_join_is_refused_at_once(tiny_model_dir):
    from gyre.engine.config import NullEngineConfig
    from gyre.engine.service import EngineService

    svc = EngineService(NullEngineConfig(engine_id="no-mem"))
    url = svc.start()
    try:
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"\(null\) do not receive weights in memory"):
            await DistributedWeightChannel([url]).connect()
        assert time.monotonic() - t0 < 10  # not rank 0's rendezvous timeout
    finally:
        svc.stop()


async def test_a_checksum_mismatch_is_refused_and_the_old_weights_stay(
    engines, trainer, monkeypatch
):
    ch = DistributedWeightChannel(engines[:1])
    await ch.connect()
    try:
        await ch.publish(10, named_params(trainer))
        held = (await _greedy(engines[0]))[2]
        real = weight_sync.encode_items

        def corrupt(params, base):
            items = real(params, base)
            items[3].checksum = "deadbeef"
            return items

        monkeypatch.setattr(weight_sync, "encode_items", corrupt)
        _step(trainer, 1e-4, seed=4)
        with pytest.raises(WeightSyncError, match="checksum mismatch"):
            await ch.publish(11, named_params(trainer))
        assert (await _greedy(engines[0]))[2] == held
        async with EngineClient(engines[0]) as c:
            assert (await c.model_info()).weight_version == 10
    finally:
        await ch.close()
