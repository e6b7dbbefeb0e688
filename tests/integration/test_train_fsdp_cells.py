"""FSDP2 cells on CPU: 2 cells x 2 ranks (4 processes, gloo, ``cpu`` mesh) against one process.

One spawn of 4 ranks (fsdp_cells.py) runs every scenario in turn: one AdamW step of the tiny
Qwen3 model (float64) for each split of the 4 micro-steps between the core and cell 1
(4+0 with k=1 and k=2, 3+1, 2+2, 1+3, 0+4), then two steps in the same processes where cell 1
misses the first (k=1), loads the core's snapshot and joins the second (k=2). Each must
give the weights and the gradient norm of one process stepping on the whole batch; both
cells must hold the same weights after a step they took part in. The gradient norm is
checked too because AdamW's first step is nearly sign(g) and would hide a scaled gradient.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import fsdp_cells
import pytest
import torch

from gyre.ports import free_ports

pytestmark = pytest.mark.slow

SCRIPT = Path(fsdp_cells.__file__)
# float64 weights; HF Qwen3's RMSNorm computes in float32, so rows grouped differently agree
# to float32 rounding in the gradient (docs/training.md, "Exactness floor")
WEIGHT_ATOL = 1e-12  # measured 4.5e-15; lr is 1e-3, so a billionth of one step
NORM_RTOL = 1e-12  # measured 1e-15


@pytest.fixture(scope="module")
def sharded_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    (port,) = free_ports()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(SCRIPT),
                f"--rank={r}",
                f"--port={port}",
                f"--model={tiny_model_dir}",
                f"--out={out}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(fsdp_cells.LAYOUT.world)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    bad = [(r, p.returncode, logs[r][-3000:]) for r, p in enumerate(procs) if p.returncode]
    assert not bad, f"ranks failed: {bad}"
    return out


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n] - b[n]).abs().max()) for n in a)


@functools.cache
def _reference(model_dir: str, batches: tuple[str, ...]):
    return fsdp_cells.reference(model_dir, list(batches))


@pytest.mark.parametrize("scenario", list(fsdp_cells.SCENARIOS))
def test_sharded_cells_step_like_one_process(sharded_run, tiny_model_dir, scenario):
    steps = fsdp_cells.SCENARIOS[scenario]
    ref, ref_norms = _reference(str(tiny_model_dir), tuple(s[0] for s in steps))
    init = {n: p.detach() for n, p in fsdp_cells.load_model(str(tiny_model_dir)).named_parameters()}
    core = torch.load(sharded_run / f"{scenario}_cell0.pt")
    assert _max_diff(core, init) > 1e-4  # the step moved the weights
    assert _max_diff(core, ref) < WEIGHT_ATOL
    norms = json.loads((sharded_run / f"{scenario}_norms.json").read_text())
    assert norms == pytest.approx(ref_norms, rel=NORM_RTOL)
    sat = torch.load(sharded_run / f"{scenario}_cell1.pt")
    if steps[-1][2] == 2:  # cell 1 took part in the last step: it holds the core's weights
        assert _max_diff(sat, core) == 0.0
    else:  # it did not: it keeps what it had (the scenario's start)
        assert _max_diff(sat, init) == 0.0
