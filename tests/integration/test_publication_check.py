"""A publication that did not reach an engine stops the run, naming the engine.

Real parts: the core is a real :class:`gyre.runtime.cell.Cell` (its replica and optimizer on
the tiny model) whose ``save_hf`` writes the HF directory and returns the fingerprints;
:meth:`gyre.runtime.cluster.Cluster.publish` runs as in ``gyre run``; two embedded engines
serve over HTTP on 127.0.0.1 and reload through ``/update_weights_from_disk``. Faked: the Ray
actor around the core (its method is called in this process, on a thread, as Ray would run
it), and, in the second engine, the reload itself: it is patched to report success while
keeping the old weights (an engine that lost or ignored the publication); the two engines'
model loads take turns (they share this process).
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from gyre.config import GyreConfig
from gyre.engine.app import create_app
from gyre.engine.client import EngineClient
from gyre.engine.config import EmbeddedEngineConfig
from gyre.engine.embedded import EmbeddedEngine
from gyre.engine.runner import ServerRunner
from gyre.runtime.cell import Cell
from gyre.runtime.cluster import Cluster
from gyre.runtime.publication import PublicationError
from gyre.runtime.rundir import RunDir


class _InProcess:
    """``actor.method.remote(*args)`` awaited on a thread: what Ray does, minus the process."""

    def __init__(self, obj):
        self._obj = obj

    def __getattr__(self, name):
        fn = getattr(self._obj, name)
        return type("M", (), {"remote": staticmethod(lambda *a: asyncio.to_thread(fn, *a))})


# Two engines in one process: transformers' from_pretrained is not thread-safe (concurrent loads
# in two worker threads leave meta tensors), so their loads take turns here. In a run each engine
# has its own process.
_LOADS = threading.Lock()


def _serve(model_dir, engine_id: str) -> ServerRunner:
    engine = EmbeddedEngine(EmbeddedEngineConfig(model_dir=str(model_dir), engine_id=engine_id))
    load = engine._load

    def one_at_a_time(path):
        with _LOADS:
            return load(path)

    engine._load = one_at_a_time  # type: ignore[method-assign]
    runner = ServerRunner(create_app(engine)).start()
    runner.engine = engine
    return runner


@pytest.fixture
def world(tiny_model_dir, tmp_path):
    cfg = GyreConfig.model_validate(
        {"model_dir": str(tiny_model_dir), "policy": {"cells": 3}, "run": {"keep_published": 1}}
    )
    core = Cell(0, 3, cfg.trainer, cfg.engine, torch_threads=torch.get_num_threads())
    core.load_replica(0, str(tmp_path / "snapshots"))
    cluster = Cluster(cfg, RunDir(tmp_path / "run").create())
    cluster.cells = [_InProcess(core)]
    engines = [_serve(tiny_model_dir, f"cell-{c}") for c in (1, 2)]
    cluster.urls = [None, engines[0].url, engines[1].url]
    yield cluster, core, engines
    for e in engines:
        e.stop()


def _train(core: Cell) -> None:
    """Stand-in for an optimizer step: every weight moves (the next version differs)."""
    with torch.no_grad():
        for p in core.trainer.replica().params:
            p.add_(1e-3)


async def test_publication_that_did_not_reach_an_engine_stops_the_run(world, monkeypatch):
    cluster, core, engines = world
    for v in (1, 2):
        _train(core)
        info = await cluster.publish(v, rollout_cells=[1, 2])  # both engines reload: both checked
        assert info["engines"] == 2 and info["checked"] == 2
    for e in engines:
        async with EngineClient(e.url) as c:
            got = await c.model_info()
        assert got.weight_version == 2 and got.weights_checksum == cluster.weights_sums["float32"]
    # run.keep_published = 1: only the newest published directory is left
    assert sorted(p.name for p in cluster.rundir.weights.glob("v*")) == ["v2"]
    # cell 2's engine now answers the reload with success but keeps what it had
    stuck = engines[1].engine
    monkeypatch.setattr(stuck, "_reload", lambda path, version: "kept the old weights")
    _train(core)
    with pytest.raises(PublicationError) as e:
        await cluster.publish(3, rollout_cells=[1, 2])
    msg = str(e.value)
    assert f"cell 2's engine ({engines[1].url})" in msg and "version 3" in msg, msg
    assert "stopping the run" in msg and "\n" not in msg
    # the healthy engine did get version 3; only the stuck one is named
    async with EngineClient(engines[0].url) as c:
        assert (await c.model_info()).weights_checksum == cluster.weights_sums["float32"]
