"""Harness profiles: how to launch a harness, and how to read roles from its requests.

A profile is a templated command line plus environment. Template variables
(``{name}``) available in ``command``, ``args`` and ``env`` values:

``instruction``, ``instruction_file``, ``workspace``, ``artifacts`` (a writable
folder outside the workspace), ``home``, ``base_url`` (as given),
``openai_base_url`` (ends in ``/v1``), ``anthropic_base_url`` (no ``/v1``),
``api_key``, ``model``, ``python`` (the interpreter running Gyre),
``python_bin`` (its folder: ``mini`` lives there), ``gyre_root`` (the folder
holding the ``gyre`` package Gyre runs from), ``claude``, ``qwen``,
``codex`` (the pinned npm binaries, see :data:`NPM_HARNESSES`),
``allowed_tools`` (comma-joined), ``solution_dir``, ``execution_id``, ``task``.

``home_files`` are configuration files written into the execution's ``$HOME``
before the harness starts (``.qwen/settings.json``, ``.codex/config.toml``):
the harness reads its settings from there, and a fresh HOME per execution
means no state leaks between executions. Their contents are templates too,
but only ``{name}`` for a known variable name is replaced, so JSON and TOML
braces need no escaping.

Every harness also gets ``OPENAI_BASE_URL``/``OPENAI_API_KEY`` and
``ANTHROPIC_BASE_URL``/``ANTHROPIC_API_KEY`` in its environment, so most need no
template at all. Profiles load from built-ins (below) or a TOML file with the
same fields.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tomllib  # Python >= 3.11 (requires-python)
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from gyre.validation import validation_line


class ProfileError(ValueError):
    """A profile that cannot be used (unknown name, bad template, bad file)."""


class HarnessProfile(BaseModel):
    name: str
    description: str = ""
    command: list[str]
    args: list[str] = Field(default_factory=list)  # appended to command (user tweaks)
    env: dict[str, str] = Field(default_factory=dict)
    api: Literal["openai", "anthropic"] = "openai"
    model: str = "policy"
    allowed_tools: list[str] = Field(default_factory=list)
    needs_solution: bool = False  # copy the task's solution/ into the execution's inputs
    roles: str | None = None  # role rule set name (gyre.harness.roles)
    home_files: dict[str, str] = Field(default_factory=dict)  # path under $HOME -> content

    def role_profile(self):  # -> gyre.trace.roles.RoleProfile
        """The role rules for this harness's requests (``gyre.harness.roles``); default rules if unknown."""
        from .roles import role_profile

        return role_profile(self.roles)

    def render(self, values: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """argv and env with every ``{var}`` filled; ProfileError names an unknown one."""
        vals = dict(values)
        vals.setdefault("allowed_tools", ",".join(self.allowed_tools))
        vals.setdefault("model", self.model)

        def fill(s: str) -> str:
            try:
                return s.format_map(vals)
            except KeyError as e:
                raise ProfileError(
                    f"profile {self.name!r}: unknown template variable {{{e.args[0]}}} in {s!r}"
                ) from None
            except (ValueError, IndexError) as e:
                raise ProfileError(f"profile {self.name!r}: bad template {s!r} ({e})") from None

        argv = [fill(a) for a in [*self.command, *self.args]]
        for rel in self.home_files:
            p = Path(rel)
            if p.is_absolute() or ".." in p.parts or not p.parts:
                raise ProfileError(
                    f"profile {self.name!r}: home_files path {rel!r} must be relative and inside $HOME"
                )
        env = {k: fill(v) for k, v in self.env.items()}
        if not argv or not argv[0]:
            raise ProfileError(f"profile {self.name!r}: empty command")
        return argv, env

    def render_home_files(self, values: dict[str, str]) -> dict[str, str]:
        """``home_files`` with each ``{known_variable}`` filled; other braces stay as written."""

        def fill(m: re.Match[str]) -> str:
            return values.get(m.group(1), m.group(0))

        return {rel: _VAR.sub(fill, text) for rel, text in self.home_files.items()}


_VAR = re.compile(r"\{([a-z_]+)\}")

# npm harnesses: template variable -> (install folder under .cache/harnesses, binary, env override).
# Versions are pinned in scripts/install-harnesses.sh (and named in docs/harness.md).
NPM_HARNESSES: dict[str, tuple[str, str, str]] = {
    "claude": ("claude-code", "claude", "GYRE_CLAUDE_BIN"),
    "qwen": ("qwen-code", "qwen", "GYRE_QWEN_BIN"),
    "codex": ("codex", "codex", "GYRE_CODEX_BIN"),
}


def find_npm_harness(var: str) -> str | None:
    """The pinned binary of an npm harness (scripts/install-harnesses.sh), else one on PATH."""
    folder, binary, env_name = NPM_HARNESSES[var]
    env = os.environ.get(env_name)
    if env:
        return env
    here = Path(__file__).resolve()
    for base in (Path.cwd(), *here.parents):
        cand = base / ".cache" / "harnesses" / folder / "node_modules" / ".bin" / binary
        if cand.exists():
            return str(cand)
    return shutil.which(binary)


def find_claude() -> str | None:
    """The pinned Claude Code binary, else one on PATH."""
    return find_npm_harness("claude")


def find_qwen() -> str | None:
    """The pinned Qwen Code binary, else one on PATH."""
    return find_npm_harness("qwen")


def find_codex() -> str | None:
    """The pinned Codex CLI binary, else one on PATH."""
    return find_npm_harness("codex")


# Qwen Code (npm @qwen-code/qwen-code) settings for an execution's $HOME. Each key
# switches off something that would make a model call or network request of its own
# (so one agent turn is one call through the proxy) or would keep state outside the
# execution: usage statistics and telemetry, update checks, managed auto-memory,
# auto-dream and auto-skill (background agents after a turn), follow-up suggestions
# and tool-use summaries (side queries), cross-session messaging (a local socket).
# The bundled ripgrep ships without its exec bit under npm; the built-in grep is used.
QWEN_SETTINGS = """{
  "general": {"enableAutoUpdate": false},
  "privacy": {"usageStatisticsEnabled": false},
  "telemetry": {"enabled": false},
  "memory": {
    "enableManagedAutoMemory": false,
    "enableManagedAutoDream": false,
    "enableAutoSkill": false
  },
  "ui": {"enableFollowupSuggestions": false, "enableUserFeedback": false},
  "agents": {"crossSessionMessaging": false},
  "experimental": {"emitToolUseSummaries": false},
  "tools": {"useRipgrep": false}
}
"""

# Codex CLI (npm @openai/codex) config for $CODEX_HOME (= $HOME/.codex). A custom
# provider points at the proxy's Responses API (the only dialect Codex speaks; the
# key comes from OPENAI_API_KEY, set by the executor). Approvals never asked; Codex's
# own sandbox off (danger-full-access) because Gyre's bubblewrap sandbox confines the
# whole process, and Codex's landlock/seccomp helper would fail or double-confine
# inside it. Analytics, update checks and the web search tool off: no traffic but the
# proxy, and no tool the policy cannot serve.
CODEX_CONFIG = """model = "{model}"
model_provider = "gyre"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false
web_search = "disabled"

[analytics]
enabled = false

[model_providers.gyre]
name = "gyre"
base_url = "{openai_base_url}"
env_key = "OPENAI_API_KEY"
wire_api = "responses"
"""


def find_mini() -> str | None:
    cand = Path(sys.executable).parent / "mini"
    return str(cand) if cand.exists() else shutil.which("mini")


# The reference agent's entry point, as ``python -c`` runs it (``python -m`` would import runpy).
REFERENCE_AGENT_MAIN = "import sys; from gyre.harness.reference_agent import main; sys.exit(main())"


def _builtin() -> dict[str, HarnessProfile]:
    py = "{python}"
    return {
        "reference": HarnessProfile(
            name="reference",
            description="Gyre's reference agent (OpenAI chat API, tools, compaction, sub-agents).",
            # -S: no site (the agent imports site-packages only for --client openai, and then
            # runs site itself); -P: the workspace is never on sys.path; -c, not -m: runpy's
            # imports are skipped. gyre is found on PYTHONPATH. Together they cut ~0.1 s of
            # its start before the first call on a loaded machine (docs/measurements.md).
            command=[
                py,
                "-S",
                "-P",
                "-c",
                REFERENCE_AGENT_MAIN,
                "--base-url",
                "{openai_base_url}",
                "--model",
                "{model}",
                "--workspace",
                "{workspace}",
                "--instruction-file",
                "{instruction_file}",
                "--answer-file",
                "answer.txt",
            ],
            env={"PYTHONPATH": "{gyre_root}"},
            roles="reference",
        ),
        "mini-swe-agent": HarnessProfile(
            name="mini-swe-agent",
            description="mini-swe-agent v2 (PyPI), unmodified, via litellm's OpenAI route.",
            command=[
                "{python_bin}/mini",
                "-m",
                "openai/{model}",
                "-c",
                "mini.yaml",
                "-c",
                "model.model_kwargs.api_base={openai_base_url}",
                "-c",
                "agent.step_limit=50",
                "-t",
                "{instruction}",
                "-y",
                "--exit-immediately",
                "-o",
                "{artifacts}/trajectory.json",
            ],
            env={
                "MSWEA_CONFIGURED": "true",
                "MSWEA_COST_TRACKING": "ignore_errors",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                "MSWEA_GLOBAL_CONFIG_DIR": "{home}/.mini-swe-agent",
                # 3 tries (waits 4 s, 8 s), not 10 (~5 min): the proxy already rides out engine
                # faults, so a call it fails is not worth minutes of a dead endpoint
                "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "3",
            },
            roles="mini-swe-agent",
        ),
        "claude-code": HarnessProfile(
            name="claude-code",
            description="Claude Code (npm, pinned), unmodified, -p mode against the proxy's Anthropic API.",
            api="anthropic",
            command=[
                "{claude}",
                "-p",
                "{instruction}",
                "--output-format",
                "json",
                "--model",
                "{model}",
                "--allowedTools",
                "{allowed_tools}",
            ],
            env={
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_TELEMETRY": "1",
                "DISABLE_AUTOUPDATER": "1",
                "DISABLE_ERROR_REPORTING": "1",
                "CLAUDE_CODE_MAX_RETRIES": "3",  # as mini-swe-agent's: a dead endpoint fails fast
            },
            allowed_tools=["Bash", "Read", "Write", "Edit", "Glob", "Grep", "Agent", "Task"],
            roles="claude-code",
        ),
        "qwen-code": HarnessProfile(
            name="qwen-code",
            description="Qwen Code (npm, pinned), unmodified, -p mode against the proxy's chat API.",
            command=[
                "{qwen}",
                "--auth-type",
                "openai",
                "--approval-mode",
                "yolo",
                "-p",
                "{instruction}",
            ],
            env={"OPENAI_MODEL": "{model}", "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1"},
            home_files={".qwen/settings.json": QWEN_SETTINGS},
            roles="qwen-code",
        ),
        "codex": HarnessProfile(
            name="codex",
            description="Codex CLI (npm, pinned), unmodified, `codex exec` against the proxy's Responses API.",
            command=["{codex}", "exec", "--skip-git-repo-check", "{instruction}"],
            env={"CODEX_HOME": "{home}/.codex"},
            home_files={".codex/config.toml": CODEX_CONFIG},
            roles="codex",
        ),
        "synthetic": HarnessProfile(
            name="synthetic",
            description="Synthetic harness: model calls spread over a random duration (scaled time).",
            command=[
                py,
                "-m",
                "gyre.harness.synthetic",
                "--base-url",
                "{openai_base_url}",
                "--model",
                "{model}",
            ],
        ),
        "oracle": HarnessProfile(
            name="oracle",
            description="Runs the task's reference solution (solution/solve.sh) in the workspace.",
            command=["bash", "{solution_dir}/solve.sh"],
            needs_solution=True,
        ),
    }


def builtin_profiles() -> dict[str, HarnessProfile]:
    return _builtin()


def load_profile(name_or_path: str | Path) -> HarnessProfile:
    """A built-in profile by name, or one read from a TOML file."""
    builtins = _builtin()
    if str(name_or_path) in builtins:
        return builtins[str(name_or_path)]
    p = Path(name_or_path).expanduser()
    if p.is_file():
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ProfileError(f"profile file {p}: not valid TOML ({e})") from None
        data.setdefault("name", p.stem)
        try:
            return HarnessProfile.model_validate(data)
        except ValidationError as e:  # say which file, in one line
            raise ProfileError(f"profile file {p}: {validation_line(e)}") from None
        except Exception as e:  # a validator that raised something pydantic does not wrap
            raise ProfileError(f"profile file {p}: {e}") from None
    raise ProfileError(
        f"unknown harness profile {str(name_or_path)!r} (built-in: {', '.join(sorted(builtins))}; or a .toml file)"
    )
