"""``run.publication = "distributed"``: a real ``gyre run`` whose engines get every publication in
memory from the core (over a gloo weight group) instead of reloading the HF directory.

The run is test_runtime.py's (its config and helpers), 4 steps on the tiny model. It must
finish, every publication's engines must have been served in memory, and each reply must have
matched the core's fingerprint (the publication check stops the run otherwise); the directory
is still written (late joiners, the fallback).
"""

from __future__ import annotations

import json

import pytest
from test_runtime import STEPS, _args, _gyre

pytestmark = pytest.mark.slow


def test_a_run_publishes_in_memory(tiny_model_dir, tmp_path):
    # async placement: cell 0 trains, the others serve throughout, so every publication has
    # rollout engines to reach (an elastic run of 4 steps may publish while all cells train)
    extra = ("run.publication=distributed", "policy.placement=async", "policy.mu=1")
    argv = _args(tiny_model_dir, tmp_path, "mem", STEPS, *extra)
    r = _gyre(argv, tmp_path / "mem.log")
    assert r.returncode == 0, r.stdout[-6000:]
    log = r.stdout
    assert "reloading from disk" not in log, log[-4000:]
    s = json.loads((tmp_path / "mem" / "summary.json").read_text())
    pubs = s["publications"]
    assert pubs["count"] >= 2
    assert pubs["engines_in_memory"] >= pubs["count"]  # every publication reached its engines
    assert pubs["engines_checked"] >= pubs["engines_in_memory"]
    assert s["disk_bytes"]["published_weights"] > 0
    mem = pubs["in_memory"]
    assert mem["count"] == pubs["count"]
    # after the first (full) publication the engines hold the base: deltas, and fewer bytes
    assert mem["deltas"] >= 1 and mem["bytes"] < mem["raw_bytes"], mem
