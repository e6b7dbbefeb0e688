"""Claim queue + membership semantics, for both backends (in-process and TCPStore)."""

import pytest
import torch

from gyre.trace.packing import MicroStep, PackedSequence
from gyre.train.demo.coordinator import LocalCoordinator, StepStalled, StoreCoordinator
from gyre.train.tasks import MicroStepTask
from gyre.train.weights import FileWeightChannel, MemoryWeightChannel, load_params, named_params


@pytest.fixture(params=["local", "store"])
def make(request):
    stores = []

    def _make(stall=5.0):
        if request.param == "local":
            return LocalCoordinator(stall_timeout_s=stall)
        import torch.distributed as dist

        st = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
        stores.append(st)
        return StoreCoordinator(st, "t", poll_s=0.001, stall_timeout_s=stall)

    yield _make


def task(i):
    row = PackedSequence.from_chain([5, 6, 7])
    row.execution_index = [-1, 0, 0]
    row.token_weight = [0.0, 0.5, 0.5]
    return MicroStepTask(i, MicroStep("paths", [row], [f"e{i}"]), [1.0], {}, ["g"])


def test_tickets_each_item_once_then_none(make):
    c = make()
    c.open_step(0, 3)
    assert c.current_step() == (0, 3)
    for i in range(3):
        c.put(0, task(i))
    c.close(0, n_scored=7, meta={"groups": ["g"]})
    got = [c.claim(0) for _ in range(4)]
    assert [t.index for t in got[:3]] == [0, 1, 2] and got[3] is None
    assert got[1].micro_step.sequences[0].input_ids == [5, 6, 7]  # round-trips through bytes
    for t in got[:3]:
        c.done(0, t.index, 0)
    seal = c.seal(0)
    assert (seal.participants, seal.n_items, seal.n_scored, seal.policy_version) == (1, 3, 7, 3)
    assert seal.meta["groups"] == ["g"] and seal.claims == {0: 3}
    assert c.is_sealed(0) and c.wait_seal(0).n_items == 3


def test_claim_waits_for_the_producer(make):
    c = make()
    c.open_step(0, 0)
    calls = []

    def produce():  # what the core's packing buffer does while it waits
        calls.append(1)
        if len(calls) == 3:
            c.put(0, task(0))

    assert c.claim(0, idle=produce).index == 0 and len(calls) == 3


def test_fixed_join_order_and_no_join_after_seal(make):
    c = make(stall=0.3)
    c.open_step(0, 0)
    with pytest.raises(StepStalled):
        c.join(0, 2)  # cell 2 must wait for cell 1
    assert c.join(0, 1) and c.join(0, 2)
    with pytest.raises(RuntimeError, match="already joined"):
        c.join(0, 1)
    c.put(0, task(0))
    c.close(0, 1)
    c.done(0, c.claim(0).index, 2)
    seal = c.seal(0)
    assert seal.participants == 3 and seal.claims == {0: 0, 1: 0, 2: 1}
    assert c.join(0, 3) is False  # the step is over


def test_errors(make):
    c = make(stall=0.2)
    c.open_step(0, 0)
    with pytest.raises(ValueError, match="out of order"):
        c.put(0, task(1))
    with pytest.raises(StepStalled):
        c.claim(0)  # nothing put, never closed: a dead producer is detected
    c.put(0, task(0))
    c.close(0, 1)
    with pytest.raises(StepStalled):
        c.seal(0)  # item 0 was claimed above (ticket 0) but never done


def test_weight_channels(tmp_path):
    m = torch.nn.Linear(3, 2)
    snap = named_params(m)
    for ch in (FileWeightChannel(tmp_path, keep=2, timeout_s=0.2), MemoryWeightChannel()):
        for v in range(3):
            ch.publish(v, {k: t + v for k, t in snap.items()})
        got = ch.pull(2)
        assert torch.equal(got["weight"], snap["weight"] + 2)
    assert sorted(p.name for p in tmp_path.glob("v*.safetensors")) == [
        "v1.safetensors",
        "v2.safetensors",
    ]
    with pytest.raises(TimeoutError):
        FileWeightChannel(tmp_path, timeout_s=0.05).pull(9)
    m2 = torch.nn.Linear(3, 2)
    load_params(m2, got)
    assert torch.equal(m2.weight, snap["weight"] + 2)
    with pytest.raises(ValueError, match="does not match"):
        load_params(torch.nn.Linear(3, 3, bias=False), got)


def test_reopening_an_abandoned_step_starts_clean(make):
    c = make()
    c.open_step(0, 0)
    c.put(0, task(0))
    c.put(0, task(1))
    assert c.join(0, 1)
    c.claim(0)  # ticket 0 taken, never done: the attempt is abandoned
    c.open_step(0, 0)
    c.put(0, task(0))
    c.close(0, 1)
    assert c.claim(0).index == 0 and c.claim(0) is None
    c.done(0, 0, 0)
    seal = c.seal(0)
    assert (seal.participants, seal.n_items, seal.claims) == (1, 1, {0: 1})


def test_task_bytes_accept_numpy_scalars():
    import numpy as np

    t = task(0)
    t.micro_step.sequences[0].input_ids = [np.int64(5), 6, 7]
    t.micro_step.sequences[0].behaviour_logprob = [0.0, np.float32(-1.5), -2.0]
    u = MicroStepTask.from_bytes(t.to_bytes())
    assert (
        u.micro_step.sequences[0].input_ids == [5, 6, 7]
        and u.micro_step.sequences[0].behaviour_logprob[1] == -1.5
    )
