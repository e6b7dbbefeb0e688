"""Every ``gyre ...`` command the README shows runs as written (exit 0), or is skipped by name.

Commands come from the README itself: each line of a fenced block that starts with ``gyre``,
and each inline code span that does. A command runs through bash (so ``&&`` and comments work)
in a fresh directory where ``gyre/`` and ``examples/`` link to the checkout, so relative paths
resolve as they do from the repository root; ``/tmp/`` in a command becomes that directory (the
README's scratch paths, kept out of the shared /tmp). Long-running commands, servers and lines
with placeholders are listed in SKIP with the reason; a SKIP entry the README no longer holds
fails the test, so the list cannot go stale.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

SKIP: dict[str, str] = {
    "gyre run": "heading, not a command: needs a config",
    "gyre run examples/quickstart.toml": "the quickstart itself: minutes of training on Ray "
    "(scripts/quickstart.sh; tests/integration/test_runtime.py runs gyre run for real)",
    "gyre run examples/quickstart.toml --set policy.placement=colocate --set policy.phi=0 "
    "--set policy.mu=4": "a full training run (minutes)",
    "gyre run examples/quickstart.toml --set policy.placement=async --set policy.phi=1.5 "
    "--set policy.mu=1": "a full training run (minutes)",
    "gyre model import smollm2 runs/smollm2": "scripts/get-smollm2.sh runs it before the suite "
    "(a second import refuses the non-empty directory); tests/integration/test_model_import.py "
    "checks the result",
    "gyre run examples/smollm2-arith.toml": "a full training run of a real model (tens of "
    "minutes); tests/integration/test_real_model_example.py runs it for 2 steps",
    "gyre run --resume runs/NAME": "placeholder NAME: a killed run's directory",
    "gyre runs list runs/": "needs run directories (tests/unit/test_runs.py runs it on some)",
    "gyre runs show runs/NAME": "placeholder NAME (tests/unit/test_runs.py)",
    "gyre runs compare DIR DIR...": "placeholder DIRs (tests/unit/test_runs.py)",
    "gyre engine --model DIR --port 30000": "placeholder DIR",
    "gyre engine --kind vllm --model DIR": "placeholder DIR; needs the vLLM venv "
    "(tests/integration/test_engine_vllm.py runs it when installed)",
    "gyre proxy --model DIR --engine URL [--engine URL ...] --port 8000": "placeholders",
    "gyre engine --model /tmp/tiny --port 30000 &": "a server left running in the background "
    "(tests/integration/test_engine_servers.py starts it)",
    "gyre proxy --model /tmp/tiny --engine http://127.0.0.1:30000 --port 8000 --trace-dir "
    "traces &": "a server left running in the background (the proxy tests start it)",
    "gyre harness demos": "a name in prose, not a command: scripts/smollm2-agent.sh --prepare "
    "runs it with its arguments (tests/unit/test_sft.py runs the CLI)",
    "gyre train sft": "a name in prose, not a command: scripts/smollm2-agent.sh --prepare runs "
    "it (tests/unit/test_sft.py trains a tiny model with it)",
    "gyre train demo --cells 3 --steps 2": "three trainer processes for minutes "
    "(the cell tests run the same code)",
    "gyre harness run TASK --profile claude-code --base-url http://127.0.0.1:8000 --api-key KEY "
    "--sandbox --json": "placeholders TASK and KEY; needs Claude Code and a live proxy",
}

# Over ~10 s on two busy cores: run, but in the slow tier.
SLOW = (
    "gyre sim --preset nl2repo-122b",
    "gyre sim sweep",
    "gyre model tiny",
    "gyre tree show",
)

# A command that reads what an earlier line of its block wrote gets that line run first.
NEEDS = {"gyre tree show /tmp/tr/": "gyre tree synth /tmp/tr"}

PROGRESS_BAR = re.compile(r"\d+%\|")  # tqdm's "100%|####|"


def _strip_comment(line: str) -> str:
    return re.sub(r"\s+#.*$", "", line).strip()


def readme_commands(text: str) -> list[str]:
    """``gyre ...`` lines of fenced blocks, then inline ``gyre ...`` spans, in README order."""
    cmds: list[str] = []
    fenced = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)
    for block in fenced:
        for line in block.splitlines():
            if line.startswith("gyre "):
                cmds.append(_strip_comment(line))
    prose = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.M | re.S)
    for span in re.findall(r"`(gyre(?: [^`]*)?)`", prose):
        cmds.append(span.strip())
    return list(dict.fromkeys(cmds))


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def test_readme_has_commands_and_skip_list_is_current() -> None:
    assert len(COMMANDS) >= 15, COMMANDS
    stale = [c for c in SKIP if c not in COMMANDS]
    assert not stale, f"SKIP names commands the README no longer shows: {stale}"
    assert "gyre config show examples/run.toml --set policy.cells=4" in COMMANDS


def _params():
    for cmd in COMMANDS:
        if cmd in SKIP:
            yield pytest.param(cmd, id=cmd[:60], marks=pytest.mark.skip(reason=SKIP[cmd]))
        elif cmd.startswith(SLOW):
            yield pytest.param(cmd, id=cmd[:60], marks=pytest.mark.slow)
        else:
            yield pytest.param(cmd, id=cmd[:60])


@pytest.mark.parametrize("cmd", list(_params()))
def test_readme_command_runs_as_written(cmd: str, tmp_path: Path) -> None:
    (tmp_path / "gyre").symlink_to(ROOT / "gyre")
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(tmp_path)  # harness workspaces land here too
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)  # gyre must silence bars itself
    script = [pre for key, pre in NEEDS.items() if key in cmd] + [cmd]
    for line in script:
        p = subprocess.run(
            ["bash", "-c", line.replace("/tmp/", f"{tmp_path}/")],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        out = p.stdout + p.stderr
        assert p.returncode == 0, f"{line}\n{out[-3000:]}"
        assert "Traceback" not in out, out[-3000:]
        assert not PROGRESS_BAR.search(out), f"a third-party progress bar leaked:\n{out[-2000:]}"
