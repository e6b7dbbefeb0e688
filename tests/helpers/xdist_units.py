"""The suite's xdist work units (scripts/test.sh runs ``-n 2 --dist loadgroup``; the scheduler
in tests/conftest.py asks :func:`work_unit`). The modules that start ``gyre run`` form the "ray"
unit, so that two runs rarely share CI's 2 cores; every other module is a unit of its own.

The ray unit is the longest (about 850 s of a 2-worker suite), so it starts first, on one
worker, while the other goes through everything else. The modules of :data:`RAY_BESIDE` are
a second unit, "ray-beside", queued right after it: the other worker starts with it, so the
longest units go first and the small ones even out the two workers' ends (queued last, its
~150 s ran alone at the end of a measured suite while the ray unit's worker sat idle). They
are modules without heartbeat or probe deadlines (no fault is injected), which a second run
beside them cannot make fail, only slow.
"""

from __future__ import annotations

# every integration module named test_runtime* is in the ray unit as well
RAY_MODULES = {
    "test_runtime.py",
    "test_runtime_chaos.py",
    "test_runtime_core_restart.py",
    "test_runtime_longtail.py",
    "test_runtime_two_nodes.py",
    "test_real_model_example.py",
    "test_runtime_cpulimit.py",
    "test_runtime_core_inplace.py",
    "test_runtime_cell_faults.py",
    "test_runtime_multirank.py",
    "test_runtime_engine_kill.py",
    "test_runtime_vllm.py",
}
# the ray unit's modules that run beside it, as a unit of their own
RAY_BESIDE = {"test_real_model_example.py"}


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: "ray", "ray-beside", or the path of its module."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    if path.startswith("tests/integration/") and (
        name in RAY_MODULES or name.startswith("test_runtime")
    ):
        return "ray-beside" if name in RAY_BESIDE else "ray"
    return path


def order(nodeid: str) -> int:
    """Where a test's unit goes in the queue: the ray unit, then the one beside it, then the rest
    in collection order."""
    return {"ray": 0, "ray-beside": 1}.get(work_unit(nodeid), 2)
