"""Task folders in the Harbor / Terminal-Bench 2 layout, and task sets.

A task is a folder::

    my-task/
      instruction.md        what the harness is told
      task.toml             [agent] timeout_sec, [verifier] timeout_sec (+ env), [gyre] extension
      environment/repo/     the starting repository (or environment/ itself, minus Dockerfile)
      tests/test.sh         the verifier; hidden from the harness, copied in only to score
      solution/solve.sh     optional reference solution (Harbor's "oracle")

Harbor builds ``environment/`` into a container image; Gyre has no container
runtime, so the starting repository is a plain directory that is copied into
each execution's fresh workspace. The ``[gyre]`` table is Gyre's extension
(Harbor ignores unknown tables): ``reward = "binary" | "fraction"``,
``overall_timeout_sec`` and ``repository`` (a path relative to the task).
"""

from __future__ import annotations

import math
import re
import tomllib  # Python >= 3.11 (requires-python)
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from .results import RESULT_FILES

RewardRule = Literal["binary", "fraction"]
_ENV_FILES_NOT_COPIED = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"}
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class TaskError(ValueError):
    """A task folder that cannot be used; the message says which file and why."""


@dataclass(frozen=True)
class Task:
    name: str
    root: Path
    instruction: str
    repository: Path  # starting repository, copied into every workspace
    tests_dir: Path  # hidden; copied next to a copy of the workspace only when scoring
    solution_dir: Path | None
    reward_rule: RewardRule
    harness_timeout_s: float
    verifier_timeout_s: float
    overall_timeout_s: float | None  # None: the executor's default (harness + verifier + slack)
    verifier_env: dict[str, str] = field(default_factory=dict)
    # Everything a sandboxed harness must not see (the task folder, or its whole task set).
    hidden_root: Path | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    # Files of the starting repository that are not copied (Harbor's container build files).
    skip_files: frozenset[str] = frozenset()
    # The one file of the verifier's that holds its result ([gyre].result; gyre.harness.results).
    result_file: str = "reward.txt"

    @property
    def hidden(self) -> Path:
        return self.hidden_root or self.root


# The longest timeout a task may ask for: a week. Past it (1e308) a deadline is no deadline,
# and ``time.monotonic() + t`` stops being a time at all.
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def _positive(value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise TaskError(f"{where} must be a number of seconds, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise TaskError(f"{where} must be a number, got {value!r}") from None
    if not (v > 0 and math.isfinite(v)):
        raise TaskError(f"{where} must be > 0 and finite, got {v}")
    if v > MAX_TIMEOUT_S:
        raise TaskError(f"{where} must be at most {MAX_TIMEOUT_S:.0f} s (7 days), got {v:g}")
    return v


# Variables that steer the dynamic loader, a shell or an interpreter before the verifier's own
# code runs: a task set is not trusted to set them (docs/harness.md, "What Gyre trusts").
_ENV_REFUSED_PREFIXES = ("LD_", "DYLD_", "PYTHON", "PERL", "RUBY", "NODE_", "GLIBC_", "MALLOC_")
_ENV_REFUSED = frozenset(
    {
        "PATH",
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "IFS",
        "PS4",
        "CDPATH",
        "GLOBIGNORE",
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
        "HOSTALIASES",
        "RESOLV_HOST_CONF",
        "TMPDIR",
        "HOME",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
    }
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def env_name_refused(name: str) -> str | None:
    """Why ``name`` may not be set by a task (None: it may); pure."""
    if not _ENV_NAME.match(name):
        return "is not a variable name (letters, digits and _, not starting with a digit)"
    up = name.upper()
    if up in _ENV_REFUSED or up.startswith(_ENV_REFUSED_PREFIXES) or up.startswith("GYRE_"):
        return "steers the loader, the shell or an interpreter (or Gyre's own contract)"
    return None


def _verifier_env(root: Path, env: Any) -> dict[str, str]:
    """``[verifier].env``, checked: plain names, scalar values without NUL, nothing that steers
    the loader or an interpreter (``LD_PRELOAD`` would load the task's code on the host)."""
    if not isinstance(env, dict):
        raise TaskError(f"task {root.name}: [verifier].env must be a table of strings")
    out: dict[str, str] = {}
    for k, v in env.items():
        where = f"task {root.name}: [verifier].env key {k!r}"
        why = env_name_refused(k)
        if why is not None:
            raise TaskError(f"{where} {why}; refused")
        if not isinstance(v, (str, int, float)):  # a table, an array or a date
            raise TaskError(f"{where} must be a string or number, got {type(v).__name__}")
        if "\0" in str(v):
            raise TaskError(f"{where}: its value holds a NUL byte")
        out[k] = str(v)
    return out


# The parts of a task that are read or copied; none may link out of the task folder.
_TASK_PARTS = (
    "instruction.md",
    "task.toml",
    "environment",
    "environment/repo",
    "tests",
    "tests/test.sh",
    "solution",
)


def _refuse_links_out(root: Path) -> None:
    """A link that leaves the task would copy host files into every workspace (``environment/repo
    -> /home/...``), quote them in the prompt (``instruction.md``), or run and expose another
    folder's hidden tests; the sandbox hides the task's own folder, not where links lead."""
    for part in _TASK_PARTS:
        p = root / part
        if not p.is_symlink() and not p.exists():
            continue
        try:
            real = p.resolve(strict=False)
        except (OSError, RuntimeError):  # a loop
            raise TaskError(f"task {root.name}: {part} is a link that cannot be resolved") from None
        if not real.is_relative_to(root):
            raise TaskError(
                f"task {root.name}: {part} links out of the task folder (to {real}); "
                "a task's files must lie inside it"
            )


def load_task(path: str | Path, hidden_root: Path | None = None) -> Task:
    """Load and check one task folder; raise TaskError naming the problem."""
    try:
        root = Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as e:  # a symlink loop (RuntimeError on Python 3.11-3.12)
        raise TaskError(f"task folder {path}: cannot be resolved ({e})") from None
    if not root.is_dir():
        raise TaskError(f"task folder {root} does not exist or is not a directory")
    _refuse_links_out(root)
    instruction, conf = _read_folder(root)
    agent = conf.get("agent", {}) or {}
    verifier = conf.get("verifier", {}) or {}
    gyre = conf.get("gyre", {}) or {}
    for tbl, name in ((agent, "agent"), (verifier, "verifier"), (gyre, "gyre")):
        if not isinstance(tbl, dict):
            raise TaskError(f"task {root.name}: [{name}] in task.toml must be a table")
    harness_timeout, verifier_timeout, overall_timeout = _timeouts(root, agent, verifier, gyre)
    rule, result = _scoring(root, gyre)
    env = _verifier_env(root, verifier.get("env", {}) or {})
    repo, skip = _repository(root, gyre)
    tests = root / "tests"
    if not (tests / "test.sh").is_file():
        raise TaskError(f"task {root.name}: missing tests/test.sh (the verifier) in {root}")
    sol = root / "solution"
    return Task(
        name=root.name,
        root=root,
        instruction=instruction,
        repository=repo.resolve(),  # real paths: what the sandbox hides is where they are
        tests_dir=tests.resolve(),
        solution_dir=sol.resolve() if sol.is_dir() else None,
        reward_rule=rule,
        result_file=result,
        harness_timeout_s=harness_timeout,
        verifier_timeout_s=verifier_timeout,
        overall_timeout_s=overall_timeout,
        verifier_env=env,
        hidden_root=hidden_root,
        metadata=dict(conf.get("metadata", {}) or {}),
        skip_files=skip,
    )


def _read_folder(root: Path) -> tuple[str, dict[str, Any]]:
    """The instruction (non-empty) and the parsed task.toml."""
    instr = root / "instruction.md"
    if not instr.is_file():
        raise TaskError(f"task {root.name}: missing instruction.md in {root}")
    instruction = instr.read_text(encoding="utf-8").strip()
    if not instruction:
        raise TaskError(f"task {root.name}: instruction.md is empty")
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        raise TaskError(f"task {root.name}: missing task.toml in {root}")
    try:
        conf = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise TaskError(f"task {root.name}: task.toml is not valid TOML ({e})") from None
    return instruction, conf


def _timeouts(
    root: Path, agent: dict, verifier: dict, gyre: dict
) -> tuple[float, float, float | None]:
    """(harness, verifier, overall or None) seconds; the harness timeout comes first."""
    harness_timeout = _positive(
        agent.get("timeout_sec", 600.0), f"task {root.name}: [agent].timeout_sec"
    )
    verifier_timeout = _positive(
        verifier.get("timeout_sec", 120.0), f"task {root.name}: [verifier].timeout_sec"
    )
    overall = gyre.get("overall_timeout_sec")
    overall_timeout = (
        None
        if overall is None
        else _positive(overall, f"task {root.name}: [gyre].overall_timeout_sec")
    )
    if overall_timeout is not None and overall_timeout < harness_timeout:
        raise TaskError(
            f"task {root.name}: [gyre].overall_timeout_sec ({overall_timeout}) is shorter than "
            f"[agent].timeout_sec ({harness_timeout}); the harness timeout must come first"
        )
    return harness_timeout, verifier_timeout, overall_timeout


def _scoring(root: Path, gyre: dict) -> tuple[RewardRule, str]:
    """The reward rule and the result file the verifier writes."""
    rule = gyre.get("reward", "binary")
    if rule not in ("binary", "fraction"):
        raise TaskError(
            f"task {root.name}: [gyre].reward must be 'binary' or 'fraction', got {rule!r}"
        )
    result = gyre.get("result", "reward.txt")
    if result not in RESULT_FILES:
        raise TaskError(
            f"task {root.name}: [gyre].result must be one of {', '.join(RESULT_FILES)}, "
            f"got {result!r}"
        )
    return rule, result


def _repository(root: Path, gyre: dict) -> tuple[Path, frozenset[str]]:
    """The starting repository and the names not copied into the workspace."""
    skip: frozenset[str] = frozenset()
    if "repository" in gyre:
        repo = (root / str(gyre["repository"])).resolve()
        if not repo.is_relative_to(root):
            raise TaskError(f"task {root.name}: [gyre].repository escapes the task folder")
    elif (root / "environment" / "repo").exists():
        repo = root / "environment" / "repo"
    else:
        repo = root / "environment"
        skip = frozenset(_ENV_FILES_NOT_COPIED)
    if not repo.is_dir():
        raise TaskError(
            f"task {root.name}: starting repository {repo} is missing "
            "(expected environment/repo/, environment/, or [gyre].repository)"
        )
    return repo, skip


def builtin_tasksets_dir() -> Path:
    """Directory holding the task sets shipped with Gyre (package data)."""
    return Path(str(resources.files("gyre.harness") / "tasksets"))


def list_builtin_tasksets() -> list[str]:
    d = builtin_tasksets_dir()
    return sorted(p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def resolve_taskset(name_or_path: str | Path) -> Path:
    p = Path(name_or_path).expanduser()
    if p.is_dir():
        return p.resolve()
    builtin = builtin_tasksets_dir() / str(name_or_path)
    if _NAME_OK.match(str(name_or_path)) and builtin.is_dir():
        return builtin
    raise TaskError(
        f"task set {name_or_path!r} is neither a directory nor a built-in set "
        f"(built-in: {', '.join(list_builtin_tasksets())})"
    )


def load_taskset(name_or_path: str | Path) -> list[Task]:
    """All tasks of a set (a folder of task folders), sorted by name.

    The whole set is the hidden root, so a sandboxed harness sees no task's tests.
    Every bad task is reported at once.
    """
    root = resolve_taskset(name_or_path).resolve()
    tasks, errors = [], []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.name.startswith(("_", ".")):
            continue
        if d.is_symlink() and not d.resolve().is_relative_to(root):
            # Another folder's task (and its hidden tests), which the sandbox would not hide.
            errors.append(f"task {d.name}: links out of the task set (to {d.resolve()})")
            continue
        try:
            tasks.append(load_task(d, hidden_root=root))
        except TaskError as e:
            errors.append(str(e))
    if errors:
        raise TaskError(f"task set {root}: {len(errors)} bad task(s):\n  " + "\n  ".join(errors))
    if not tasks:
        raise TaskError(f"task set {root} holds no task folders")
    return tasks
