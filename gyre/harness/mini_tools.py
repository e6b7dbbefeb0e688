"""Start mini-swe-agent (unmodified) with our tool-use config, then save its submission.

``python -m gyre.harness.mini_tools --mini BIN --base-url URL --model M --instruction-file F
--workspace W --trajectory PATH``: runs ``mini -c gyre/harness/mini_tools.yaml`` on the task
in ``W`` and, once it exits, writes the run's submission (the output lines after
``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, e.g. ``Answer: 5535``) to ``W/answer.txt``, where
the family's verifier reads the reply. The harness itself runs as shipped: this is the
launcher a shell script would be, and nothing of mini-swe-agent is patched. A run cut by the
harness timeout leaves no answer.txt, and its workspace scores 0.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

CONFIG = Path(__file__).resolve().with_name("mini_tools.yaml")
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def demonstration(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A family's oracle conversation (the reference agent's: task, tool call, tool output,
    answer) as mini-swe-agent with :data:`CONFIG` holds it: the config's system prompt, the
    task as mini's instance message, each tool call as a bash block in the reply's text,
    each output as mini's observation (a user turn), and the answer as the submit command.
    A warm-up on these (``gyre harness demos --harness mini-swe-agent``) teaches the format
    mini parses, which the reference agent's demonstrations do not: there the answer is a
    reply, here it must be a command."""
    system, obs = _templates()
    out: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for m in messages:
        if m["role"] == "user":
            out.append({"role": "user", "content": m["content"]})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            (call,) = m["tool_calls"]
            out.append(
                {"role": "assistant", "content": _block(call["function"]["arguments"]["command"])}
            )
        elif m["role"] == "tool":
            status, _, output = m["content"].partition("\n")
            rc = int(status.removeprefix("exit status "))
            out.append(
                {"role": "user", "content": obs.render(output={"returncode": rc, "output": output})}
            )
        elif m["role"] == "assistant":
            answer = m["content"].strip().splitlines()[-1]
            out.append(
                {"role": "assistant", "content": _block(f"echo {SUBMIT} && echo '{answer}'")}
            )
        else:
            raise ValueError(f"a demonstration turn mini-swe-agent has no form for: {m['role']!r}")
    return out


@functools.cache
def _templates() -> tuple[str, Any]:
    """mini's system prompt and observation template from :data:`CONFIG` (read once, not
    once per demonstration)."""
    import yaml  # type: ignore[import-untyped]  # yaml, jinja2: as mini reads and renders
    from jinja2 import StrictUndefined, Template

    cfg = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    obs = Template(cfg["model"]["observation_template"], undefined=StrictUndefined)
    return cfg["agent"]["system_template"], obs


def _block(command: str) -> str:
    return f"```bash\n{command}\n```"


def submission(trajectory: Path) -> str:
    """The submission a mini-swe-agent trajectory file records ('' if none or unreadable)."""
    try:
        info = json.loads(trajectory.read_text(encoding="utf-8")).get("info") or {}
    except (OSError, ValueError, AttributeError):
        return ""
    sub = info.get("submission") if isinstance(info, dict) else None
    return sub if isinstance(sub, str) else ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("--mini", "--base-url", "--model", "--instruction-file", "--trajectory"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--workspace", default=".")
    a = ap.parse_args(argv)
    task = Path(a.instruction_file).read_text(encoding="utf-8")
    cmd = [
        a.mini, "-m", f"openai/{a.model}", "-c", str(CONFIG),
        "-c", f"model.model_kwargs.api_base={a.base_url}",
        "-t", task, "-y", "--exit-immediately", "-o", a.trajectory,
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=a.workspace)

    # a SIGTERM from the executor (harness timeout) reaches mini too; then no answer is saved
    def stop(*_: object) -> None:
        proc.terminate()
        sys.exit(143)

    signal.signal(signal.SIGTERM, stop)
    rc = proc.wait()
    sub = submission(Path(a.trajectory))
    if sub:
        (Path(a.workspace) / "answer.txt").write_text(sub, encoding="utf-8")
    return rc


if __name__ == "__main__":
    sys.exit(main())
