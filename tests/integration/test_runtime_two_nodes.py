"""`gyre run --address` on a two-node Ray cluster started by this test, cells placed by config.

Two nodes on this machine (head on 127.0.0.2 offering ``node_a``, a second node on 127.0.0.3
offering ``node_b``; loopback only, own temp dir, ports and auth token: see ray_nodes.py).
The config pins the core to node A and both satellites to node B through
``run.cell_resources`` alone; the run must complete as the one-node run does (every step, no
interrupted execution, no proxy error, a satellite trained), and cells.json must show each
cell on the node that offers its resource, told apart by Ray node id. Nothing binds 127.0.0.1
as if every node were the driver's: each cell's engines serve at its own node's IP (the proxy
reached the node-B satellites at 127.0.0.3, and their tokens are in the traces) and the gloo
world is served at the core's node IP. The cluster is torn down afterwards, also on failure,
and must leave no process behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from ray_nodes import RayNodes

from gyre.trace.store import read_trace

STEPS = 3

CONFIG = """
seed = 0

[policy]
placement = "elastic"
cells = 3
cell_capacity = 4
group_size = 4
batch_groups = 2
phi = 0.5
mu = 3
streaming = true
rho_min = 0.25
hold_tau = 0.0

[engine]
max_batch = 16

[trainer.optim]
lr = 0.003

[trainer.objective]
clip_low = 0.8
clip_high = 1.25

[executor]
max_concurrency = 64

[run]
taskset = "quickstart"
profile = "reference"
harness_args = ["--max-turns", "1", "--max-tokens", "24", "--no-delegate", "--client", "stdlib"]
# the core on node A, both satellites on node B: placement by config, not code
cell_resources = [{node_a = 1}, {node_b = 1}, {node_b = 1}]

[run.cell]
calibrate_s = 0.0  # the start-up calibration (2 s) only where a test reads it
"""

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]


@pytest.fixture(scope="module")
def nodes():
    c = RayNodes()
    try:
        c.start_node(head=True, ip="127.0.0.2", num_cpus=2, resources={"node_a": 2})
        c.start_node(head=False, ip="127.0.0.3", num_cpus=2, resources={"node_b": 2})
        yield c
    finally:
        c.stop()
        left = c.alive()
        c.cleanup()
        assert not left, f"processes of the test's Ray cluster still alive: {left}"


def _argv(nodes: RayNodes, model_dir, tmp_path: Path, *sets: str) -> list[str]:
    cfg = tmp_path / "two-nodes.toml"
    cfg.write_text(f'model_dir = "{model_dir}"\n' + CONFIG)
    argv = [sys.executable, "-m", "gyre.cli", "run", str(cfg), "--address", nodes.address]
    for x in (f"policy.total_steps={STEPS}", f"run.out_dir={tmp_path}", "run.name=two", *sets):
        argv += ["--set", x]
    return [*argv, "--log-format", "plain"]


def test_cells_on_two_nodes_run_completes(nodes: RayNodes, tiny_model_dir, tmp_path: Path):
    by_resource = {
        name: n["id"]
        for n in nodes.nodes()
        for name in ("node_a", "node_b")
        if name in n["resources"]
    }
    assert len(by_resource) == 2 and by_resource["node_a"] != by_resource["node_b"]
    argv = _argv(nodes, tiny_model_dir, tmp_path)
    log = tmp_path / "run.log"
    t0 = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.Popen(
            argv,
            stdout=f,
            stderr=subprocess.STDOUT,
            # two machines' worth: the gloo world meets over TCP, not in the driver's folder
            env={**nodes.env(), "TOKENIZERS_PARALLELISM": "false", "GYRE_RENDEZVOUS": "tcp"},
            cwd=tmp_path,
            start_new_session=True,
        )
        try:
            rc = p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise AssertionError(f"gyre run did not finish:\n{log.read_text()[-4000:]}") from None
    seconds = time.monotonic() - t0
    text = log.read_text()
    assert rc == 0, text[-6000:]

    rd = tmp_path / "two"
    cells = json.loads((rd / "cells.json").read_text())
    s = json.loads((rd / "summary.json").read_text())
    print(f"\ntwo-node run: {seconds:.0f} s wall, makespan {s['makespan_s']:.0f} s; cells: {cells}")
    # each cell ran on the node that offers the resource its config entry asked for
    want = ["node_a", "node_b", "node_b"]
    assert [c["cell"] for c in cells] == [0, 1, 2]
    for c, name in zip(cells, want):
        assert c["resources"] == {name: 1.0}
        assert c["node"] == by_resource[name], (c, by_resource)
    assert len({c["node"] for c in cells}) == 2
    assert [c["node_ip"] for c in cells] == ["127.0.0.2", "127.0.0.3", "127.0.0.3"]
    assert s["cells"] == cells

    # each cell served where its node is, and the gloo world where the core is
    assert {c["gloo"].rpartition(":")[0] for c in cells} == {"127.0.0.2"}, cells
    assert len({c["gloo"] for c in cells}) == 1 and not cells[0]["gloo"].endswith(":0")
    assert len(s["engine_urls"]) == 3 and all(s["engine_urls"][1:]), s["engine_urls"]
    for c, urls in zip(cells, s["engine_urls"]):
        hosts = {urlsplit(u).hostname for u in urls + ([c["url"]] if "url" in c else [])}
        assert hosts <= {c["node_ip"]}, (c, urls)  # node B's: 127.0.0.3, never 127.0.0.1
    served = {
        seg.engine_id
        for p in (rd / "traces").rglob("*.jsonl")
        for r in read_trace(p).records
        for seg in r.segments
    }
    assert {"cell-1", "cell-2"} <= served, served  # the proxy got tokens from node B's engines

    # the run completes as the one-node run does
    assert s["steps"] == STEPS and s["policy"]["done"] is True
    assert s["interrupted_executions"] == 0
    assert s["proxy"]["errors_5xx"] == 0 and s["proxy"]["engine_errors"] == 0
    assert s["executions"]["failed"] == 0 and s["executions"]["missing"] == 0
    assert s["proxy"]["records"] == s["proxy"]["answered"] > 0
    assert s["switches"]["training"]["count"] >= 1  # a node-B satellite joined training
    assert any(sh.get("training", 0) > 0 for sh in s["role_shares"][1:])
    assert f"step {STEPS}/{STEPS}" in text


def test_a_resource_no_node_offers_is_refused_not_left_pending(
    nodes: RayNodes, tiny_model_dir, tmp_path: Path
):
    """Ray would keep such a cell pending forever; gyre run says why in one line, exit 1."""
    argv = _argv(
        nodes, tiny_model_dir, tmp_path, 'run.cell_resources=[{"node_a": 1}, {"node_c": 1}, {}]'
    )
    r = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, env=nodes.env(), cwd=tmp_path
    )
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-4000:])
    lines = [x for x in r.stderr.splitlines() if x.startswith("gyre run:")]
    assert len(lines) == 1 and "node_c=1" in lines[0] and "offers 0" in lines[0], r.stderr[-3000:]
    assert "Traceback" not in r.stderr
