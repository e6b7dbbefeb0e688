"""A task's environment reaches only the sandbox, never the host (issue 37, finding 1).

The host-side ``bwrap`` runs before any namespace exists: a variable in its own environment
that steers the loader (``LD_PRELOAD``) runs the task's code on the host, as the launcher.
Here a real shared object, built with the system's C compiler, writes a marker file from its
constructor the moment any process loads it; the marker path lies outside every sandbox.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.harness.config import ExecutorConfig, SandboxConfig
from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.sandbox import bwrap_available
from gyre.harness.task import TaskError, load_task
from gyre.trace.assessment import Scored

sys.path.insert(0, str(Path(__file__).parent))
from test_harness_util import CHECK_42, make_task, shell_profile

pytestmark = [
    pytest.mark.skipif(shutil.which("gcc") is None, reason="no C compiler"),
    pytest.mark.skipif(bwrap_available() is None, reason="no bwrap"),
]

PROBE_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void probe(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "loaded\n", 7); close(fd); }
}
"""

# Scores 1 when the task's harmless variable reached the verifier inside the sandbox.
CHECK_FOO = """#!/usr/bin/env bash
if [ "$FOO" = bar ]; then echo 1 > "$GYRE_REWARD_DIR/reward.txt"; else echo 0 > "$GYRE_REWARD_DIR/reward.txt"; fi
"""


def build_probe(out: Path, marker: Path) -> Path:
    src = out.with_suffix(".c")
    src.write_text(PROBE_C)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    return out


def probe_task(tmp_path: Path, env_line: str, test_sh: str = CHECK_FOO) -> tuple[Path, Path]:
    """A task shipping tests/probe.so, with ``env_line`` in its [verifier] table."""
    marker = tmp_path / "host-marker"
    d = make_task(tmp_path / "set", test_sh=test_sh)
    build_probe(d / "tests" / "probe.so", marker)
    toml = (d / "task.toml").read_text()
    (d / "task.toml").write_text(toml.replace("[gyre]", f"{env_line}\n[gyre]"))
    return d, marker


async def run_one(
    tmp_path: Path, task, extra_env: dict[str, str] | None = None, script: str = "true"
):
    cfg = ExecutorConfig(
        workspace_root=tmp_path / "runs", kill_grace_s=0.5, sandbox=SandboxConfig(enabled=True)
    )
    spec = ExecutionSpec(
        execution_id="e1",
        task=task,
        profile=shell_profile(script),
        base_url="http://127.0.0.1:9",
        api_key="k",
        extra_env=extra_env or {},
    )
    async with HarnessExecutor(cfg) as ex:
        return await asyncio.wait_for(ex.run(spec), 120)


def test_the_probe_is_a_real_preload(tmp_path):
    """The probe works: any process that preloads it writes the marker (here, on the host)."""
    marker = tmp_path / "m"
    so = build_probe(tmp_path / "p.so", marker)
    subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(so)}, check=True)
    assert marker.read_text() == "loaded\n"


def test_a_task_setting_ld_preload_is_refused_at_load(tmp_path):
    d, marker = probe_task(tmp_path, 'env = { LD_PRELOAD = "../tests/probe.so" }')
    with pytest.raises(TaskError, match="LD_PRELOAD.*steers the loader"):
        load_task(d)
    assert not marker.exists()


async def test_the_verifier_env_never_reaches_the_host_side_bwrap(tmp_path):
    """Past the loader's check (a Task built in code), the variable still reaches only the
    sandbox: the host-side bwrap does not load the task's .so, the verifier sees FOO."""
    d, marker = probe_task(tmp_path, 'env = { FOO = "bar" }')
    task = load_task(d)
    task = dataclasses.replace(
        task, verifier_env={**task.verifier_env, "LD_PRELOAD": "../tests/probe.so"}
    )
    res = await run_one(tmp_path, task)
    assert isinstance(res.assessment, Scored) and res.assessment.reward == 1.0, res.assessment
    assert not marker.exists(), "the task's .so was loaded on the host"


async def test_the_harness_env_never_reaches_the_host_side_bwrap(tmp_path):
    """The harness's environment (here the runtime's ``extra_env``) likewise: inside only."""
    d, _ = probe_task(tmp_path, "", test_sh=CHECK_42)
    marker = tmp_path / "harness-marker"
    so = build_probe(tmp_path / "h.so", marker)
    env = {"LD_PRELOAD": str(so), "FOO": "bar"}
    script = 'if [ "$FOO" = bar ]; then echo 42 > answer.txt; fi'
    res = await run_one(tmp_path, load_task(d), extra_env=env, script=script)
    assert isinstance(res.assessment, Scored) and res.assessment.reward == 1.0, res.assessment
    assert not marker.exists(), "the harness's LD_PRELOAD was loaded on the host"
