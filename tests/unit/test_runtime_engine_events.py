"""The runtime's use of the proxy heartbeat's events (issue 20): a lost standalone engine leaves
the pool at once and counts as dead; a cell's engine is left to the policy."""

import asyncio
import time

import gyre.runtime.cluster as cluster_mod
from gyre.config import GyreConfig
from gyre.proxy.heartbeat import EngineEvent
from gyre.runtime.cluster import Cluster
from gyre.runtime.rundir import RunDir


async def test_lost_standalone_engine_leaves_at_once_cell_engine_stays(tmp_path, monkeypatch):
    killed: list[object] = []
    # the lost engine's actor is killed; a real ray.kill would start a Ray instance here
    monkeypatch.setattr(cluster_mod.ray, "kill", lambda a, **_: killed.append(a))
    cluster = Cluster(GyreConfig(model_dir="/nonexistent"), RunDir(tmp_path / "run"))
    s0, s1 = object(), object()
    cluster.standalone = [(s0, "http://s0"), (s1, "http://s1")]
    cluster.urls = ["http://c0"]

    def event(kind: str, url: str) -> EngineEvent:
        return EngineEvent(kind, url, url, time.time(), "silent", 3.0)  # type: ignore[arg-type]

    cluster._on_engine_event(event("lost", "http://c0"))  # a cell's: the policy decides
    cluster._on_engine_event(event("lost", "http://s1"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert [u for _, u in cluster.standalone] == ["http://s0"]
    assert cluster.dead_engines == ["http://s1"]
    assert killed == [s1]
    assert [(e.kind, e.url) for e in cluster.engine_events] == [
        ("lost", "http://c0"),
        ("lost", "http://s1"),
    ]
    # the next publication failing to reload it does not end the run: it is gone already
    await cluster._engine_lost("http://s1", RuntimeError("connection refused"))
    assert cluster.dead_engines == ["http://s1"]


async def test_a_reload_failing_on_a_replaced_cells_engine_is_not_the_runs_error(tmp_path):
    """A publication that began while cell 2 served at c2 fails to reload it after the
    heartbeat found the cell hung and killed it (CI: ReadError on /pause_generation ended the
    run): that engine's loss is the cell's fault, handled already. An engine no cell or
    standalone pool ever had still stops the run."""
    cluster = Cluster(GyreConfig(model_dir="/nonexistent"), RunDir(tmp_path / "run"))
    lost: list[int] = []
    cluster.on_cell_lost = lambda c, e, where: lost.append(c)
    cluster.urls = ["http://c0", "http://c1", None]  # cell 2 lost: its engine left the pool
    cluster.engine_urls = [["http://c0"], ["http://c1"], ["http://c2"]]
    await cluster._engine_lost("http://c2", RuntimeError("ReadError"))
    assert lost == [] and cluster.dead_engines == []
    await cluster._engine_lost("http://c1", RuntimeError("ReadError"))  # still cell 1's
    assert lost == [1]
    try:
        await cluster._engine_lost("http://elsewhere", RuntimeError("ReadError"))
    except RuntimeError as e:
        assert "failed to reload weights" in str(e)
    else:
        raise AssertionError("an unknown engine's failure passed")
