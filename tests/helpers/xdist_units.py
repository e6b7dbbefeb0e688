"""The suite's xdist work units (scripts/test.sh runs ``-n 2 --dist loadgroup``; the scheduler
in tests/conftest.py asks :func:`work_unit`). The modules that start ``gyre run`` form the "ray"
unit, so that two runs rarely share CI's 2 cores; every other module is a unit of its own.

The ray unit is the longest (about 950 s of a 2-worker suite), so it starts first, on one
worker, while the other goes through everything else and would then wait idle for it. The
modules of :data:`RAY_TAIL` are a second unit, "ray-tail", queued last: the worker that runs
out of other work first takes it, overlapping only the end of the ray unit. They are modules
without heartbeat or probe deadlines (no fault is injected), which a second run beside them
cannot make fail, only slow.
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
    "test_runtime_publication_memory.py",
    "test_runtime_engine_kill.py",
    "test_runtime_vllm.py",
}
# the ray unit's modules that go last, as a unit of their own (their length: about what the
# other worker would otherwise wait for the ray unit, measured on a 2-worker suite)
RAY_TAIL = {"test_real_model_example.py"}


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: "ray", "ray-tail", or the path of its module."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    if path.startswith("tests/integration/") and (
        name in RAY_MODULES or name.startswith("test_runtime")
    ):
        return "ray-tail" if name in RAY_TAIL else "ray"
    return path


def order(nodeid: str) -> int:
    """Where a test's unit goes in the queue: the ray unit first, the ray tail last."""
    return {"ray": 0, "ray-tail": 2}.get(work_unit(nodeid), 1)
