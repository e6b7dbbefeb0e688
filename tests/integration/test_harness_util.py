"""Helpers for the harness tests: throwaway tasks and shell-command profiles."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from gyre.harness.profiles import HarnessProfile

# Verifier: answer.txt must hold "42" (binary). Writes Harbor's reward.txt.
CHECK_42 = """#!/usr/bin/env bash
if [ "$(cat "$GYRE_WORKSPACE/answer.txt" 2>/dev/null)" = "42" ]; then echo 1 > "$GYRE_REWARD_DIR/reward.txt"; else echo 0 > "$GYRE_REWARD_DIR/reward.txt"; fi
"""


def make_task(
    root: Path,
    name: str = "t42",
    *,
    test_sh: str = CHECK_42,
    agent_timeout: float = 30.0,
    verifier_timeout: float = 20.0,
    overall: float | None = None,
    rule: str = "binary",
    secret: str | None = None,
) -> Path:
    d = root / name
    (d / "environment" / "repo").mkdir(parents=True)
    (d / "environment" / "repo" / "README.md").write_text("write 42 into answer.txt\n")
    (d / "tests").mkdir()
    (d / "tests" / "test.sh").write_text(test_sh)
    if secret is not None:
        (d / "tests" / "secret.txt").write_text(secret)
    (d / "instruction.md").write_text("Write 42 into answer.txt.\n")
    extra = f"overall_timeout_sec = {overall}\n" if overall is not None else ""
    (d / "task.toml").write_text(
        textwrap.dedent(f"""\
        version = "1.0"
        [agent]
        timeout_sec = {agent_timeout}
        [verifier]
        timeout_sec = {verifier_timeout}
        [gyre]
        reward = "{rule}"
        """)
        + extra
    )
    return d


def shell_profile(script: str, name: str = "shell") -> HarnessProfile:
    return HarnessProfile(name=name, command=["bash", "-c", script])


def live_pids_with(marker: str) -> list[int]:
    """PIDs whose command line contains ``marker`` (zombies excluded)."""
    out = []
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{e}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            out.append(int(e))
    return out
