"""Scoring a workspace with the task's own tests, in a separate process.

The verifier never touches the live workspace: it runs against a *copy*, with
the task's hidden ``tests/`` copied next to it only now, in its own process
group with its own timeout (optionally in a bubblewrap sandbox without
network). The reward is read from files the verifier writes, never from the
harness's exit status or how long it ran.

Verifier contract (``tests/test.sh``, run with ``bash`` and cwd = the copy):

- environment: ``GYRE_WORKSPACE`` (the copy), ``GYRE_TESTS_DIR`` (the hidden
  tests), ``GYRE_REWARD_DIR`` (where to write the result), ``GYRE_PYTHON``;
  ``PATH`` starts with the Python that runs Gyre (pytest is there);
- result, first found wins: ``$GYRE_REWARD_DIR/reward.json``
  (``{"reward": x}`` or ``{"passed": p, "total": t}``),
  ``reward.txt`` (one number, Harbor's convention), or ``junit.xml``
  (pytest ``--junitxml``; passed = tests - failures - errors - skipped).
- no result file, an unreadable one, or a verifier past its timeout is a
  *missing* assessment, never a zero.

With the sandbox on, the verifier also sees Harbor's paths: the copy at
``/app`` (its cwd), the tests at ``/tests``, the result folder at
``/logs/verifier`` (the ``GYRE_*`` variables then point there), so a Harbor
``test.sh`` that hard-codes them runs unchanged.
Without the sandbox those paths are the host's own (a verifier would write the
host's ``/logs``), so a verifier whose files name them is refused: a missing
assessment saying to use the sandbox, and nothing is run.

Rule ``binary``: 1 if every test passed (or the reward is >= 1), else 0.
Rule ``fraction``: passed / total (or the reward clipped to [0, 1]).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gyre.trace.assessment import Missing, MissingReason, Scored

from .config import ScorerConfig
from .process import run_process
from .sandbox import HARBOR_APP, HARBOR_LOGS, HARBOR_TESTS, Confinement, harbor_verifier_argv
from .task import Task
from .userns import chown_tree, make_userns

# Harbor's absolute paths as a verifier script names them (``cd /app``, ``/logs/verifier/...``),
# not as a piece of a longer path (``$GYRE_TESTS_DIR/x``, ``./tests``, ``a/app``).
_HARBOR_PATH = re.compile(r"(?<![\w.$}/-])/(app|tests|logs)(?![\w.-])")
_SCAN_BYTES = 1 << 20


def harbor_paths(text: str) -> set[str]:
    """The Harbor paths (``/app``, ``/tests``, ``/logs``) that ``text`` uses; pure."""
    return {"/" + m.group(1) for m in _HARBOR_PATH.finditer(text)}


def harbor_paths_in(tests_dir: Path) -> set[str]:
    """Harbor paths used by the verifier's files (each read up to 1 MiB; binaries skipped)."""
    found: set[str] = set()
    for f in sorted(tests_dir.rglob("*")):
        if not f.is_file() or f.is_symlink():
            continue
        try:
            with open(f, "rb") as fh:
                data = fh.read(_SCAN_BYTES)
        except OSError:
            continue
        if b"\0" not in data:
            found |= harbor_paths(data.decode("utf-8", "replace"))
    return found


class _ResultError(Exception):
    pass


def _read_result(reward_dir: Path) -> tuple[float | None, int | None, int | None, str] | None:
    """(reward, passed, total, source) from the verifier's files, or None if none was written."""
    rj = reward_dir / "reward.json"
    if rj.is_file():
        try:
            d = json.loads(rj.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _ResultError(f"reward.json is not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise _ResultError("reward.json must hold an object")
        if "passed" in d and "total" in d:
            try:
                p, t = int(d["passed"]), int(d["total"])
            except (TypeError, ValueError):
                raise _ResultError(f"reward.json passed/total are not integers: {d}") from None
            if t < 0 or not 0 <= p <= max(t, 0):
                raise _ResultError(f"reward.json passed/total out of range: {p}/{t}")
            return None, p, t, "reward.json"
        if "reward" in d:
            return _number(d["reward"], "reward.json"), None, None, "reward.json"
        raise _ResultError("reward.json has neither 'reward' nor 'passed'/'total'")
    rt = reward_dir / "reward.txt"
    if rt.is_file():
        return _number(rt.read_text().strip(), "reward.txt"), None, None, "reward.txt"
    jx = reward_dir / "junit.xml"
    if jx.is_file():
        try:
            root = ET.parse(jx).getroot()
        except ET.ParseError as e:
            raise _ResultError(f"junit.xml is malformed ({e})") from None
        suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
        tests = fails = skipped = 0
        for s in suites:
            tests += int(s.get("tests", 0))
            fails += int(s.get("failures", 0)) + int(s.get("errors", 0))
            skipped += int(s.get("skipped", 0))
        total = tests - skipped
        return None, max(0, total - fails), max(total, 0), "junit.xml"
    return None


def _number(v: Any, where: str) -> float:
    """A finite float from a parsed JSON/text value (anything else is the verifier's error)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise _ResultError(f"{where}: {v!r} is not a number") from None
    if math.isnan(x) or math.isinf(x):
        raise _ResultError(f"{where}: {v!r} is not a finite number")
    return x


def apply_rule(rule: str, reward: float | None, passed: int | None, total: int | None) -> float:
    """The task's reward rule; pure, so the rule is tested on its own."""
    if reward is None:
        assert passed is not None and total is not None
        if rule == "binary":
            return 1.0 if total > 0 and passed == total else 0.0
        return passed / total if total > 0 else 0.0
    if rule == "binary":
        return 1.0 if reward >= 1.0 else 0.0
    return min(1.0, max(0.0, reward))


def _copy_tree(src: Path, dst: Path, skip: frozenset[str] = frozenset()) -> None:
    ignore = (lambda d, names: [n for n in names if n in skip]) if skip else None
    shutil.copytree(src, dst, symlinks=True, ignore=ignore, dirs_exist_ok=False)


class Scorer:
    """Scores workspaces; holds a concurrency limit, nothing global."""

    def __init__(
        self,
        config: ScorerConfig | None = None,
        *,
        bwrap: str | None = None,
        hide: Sequence[Path] = (),
        confine: Confinement | None = None,
    ) -> None:
        self.config = config or ScorerConfig()
        self._bwrap = bwrap  # None: no sandbox
        self._confine = confine or Confinement()
        self._hide = list(hide)
        self._sem = asyncio.Semaphore(self.config.max_concurrency)

    async def score(
        self, task: Task, workspace: Path, scratch: Path, timeout_s: float | None = None
    ) -> Scored | Missing:
        """Assess ``workspace`` by ``task``'s rule. ``timeout_s`` caps the verifier (overall budget)."""
        budget = (
            task.verifier_timeout_s
            if timeout_s is None
            else min(timeout_s, task.verifier_timeout_s)
        )
        cut_by_budget = timeout_s is not None and timeout_s < task.verifier_timeout_s
        if budget <= 0:
            return Missing(
                reason=MissingReason.overall_timeout, detail="no budget left to run the verifier"
            )
        async with self._sem:
            t0 = time.monotonic()
            try:
                return await self._score(
                    task, Path(workspace), Path(scratch), budget, cut_by_budget, t0
                )
            finally:
                if not self.config.keep_scratch:
                    await asyncio.to_thread(shutil.rmtree, scratch, True)

    async def _score(
        self, task: Task, workspace: Path, scratch: Path, budget: float, cut: bool, t0: float
    ) -> Scored | Missing:
        ws, tests, reward_dir, home = (
            scratch / "workspace",
            scratch / "tests",
            scratch / "reward",
            scratch / "home",
        )
        try:
            if scratch.exists():
                await asyncio.to_thread(shutil.rmtree, scratch)
            scratch.mkdir(parents=True)
            await asyncio.to_thread(_copy_tree, workspace, ws)
            await asyncio.to_thread(_copy_tree, task.tests_dir, tests)
            reward_dir.mkdir()
            home.mkdir()
        except OSError as e:
            return Missing(
                reason=MissingReason.infra_error, detail=f"could not prepare the scoring copy: {e}"
            )
        py_bin = str(Path(self.config.python).parent)
        env = {
            "PATH": f"{py_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "GYRE_WORKSPACE": str(ws),
            "GYRE_TESTS_DIR": str(tests),
            "GYRE_REWARD_DIR": str(reward_dir),
            "GYRE_PYTHON": self.config.python,
            **task.verifier_env,
        }
        argv = ["bash", str(tests / "test.sh")]
        userns_fd: int | None = None
        sandboxed = bool(self._bwrap and self.config.sandbox)
        if not sandboxed:
            # Unsandboxed, /app, /tests and /logs are the host's own: a Harbor verifier would
            # write the host's /logs (or read anyone's /app). Refused, not run.
            used = await asyncio.to_thread(harbor_paths_in, tests)
            if used:
                return Missing(
                    reason=MissingReason.evaluator_error,
                    detail=f"verifier uses Harbor's absolute paths ({', '.join(sorted(used))}), "
                    "which only the sandbox maps; run it with the sandbox (--sandbox)",
                )
        else:
            if os.geteuid() == 0:  # the verifier runs as the sandbox user: hand it the copy
                try:
                    c = self._confine
                    await asyncio.to_thread(chown_tree, scratch, c.uid, c.gid)
                    userns_fd = await asyncio.to_thread(make_userns, c.uid, c.gid)
                except OSError as e:
                    return Missing(
                        reason=MissingReason.infra_error, detail=f"sandbox setup failed: {e}"
                    )
            # Harbor's paths too: /app (workspace copy), /tests, /logs/verifier; no network.
            assert self._bwrap  # sandboxed
            # Off the loop: resolving the mounts stats hundreds of paths (~25 ms per call).
            try:
                argv = await asyncio.to_thread(
                    harbor_verifier_argv,
                    ["bash", f"{HARBOR_TESTS}/test.sh"],
                    workspace_copy=ws,
                    tests=tests,
                    reward_dir=reward_dir,
                    hide=self._hide + [task.hidden],
                    home=str(home),
                    bwrap=self._bwrap,
                    confine=self._confine,
                    userns_fd=userns_fd,
                )
            except BaseException:  # cancelled or failed before the try below owns these
                if userns_fd is not None:
                    os.close(userns_fd)
                raise
            env.update(
                GYRE_WORKSPACE=HARBOR_APP, GYRE_TESTS_DIR=HARBOR_TESTS, GYRE_REWARD_DIR=HARBOR_LOGS
            )
        remaining = budget - (time.monotonic() - t0)
        try:
            res = await run_process(
                argv,
                cwd=ws,
                env=env,
                stdout_path=scratch.parent / f"{scratch.name}.verifier.stdout",
                stderr_path=scratch.parent / f"{scratch.name}.verifier.stderr",
                timeout_s=remaining,
                max_log_bytes=self.config.max_log_bytes,
                pass_fds=() if userns_fd is None else (userns_fd,),
            )
        except OSError as e:
            return Missing(
                reason=MissingReason.evaluator_error, detail=f"could not start the verifier: {e}"
            )
        finally:
            if userns_fd is not None:
                os.close(userns_fd)
        if res.stop in ("timeout", "log_limit"):
            reason = (
                MissingReason.overall_timeout
                if (cut and res.stop == "timeout")
                else (
                    MissingReason.evaluator_timeout
                    if res.stop == "timeout"
                    else MissingReason.evaluator_error
                )
            )
            what = "flooded its log" if res.stop == "log_limit" else f"ran past {budget:.1f}s"
            return Missing(reason=reason, detail=f"verifier {what} and was killed")
        try:
            found = _read_result(reward_dir)
        except _ResultError as e:
            return Missing(
                reason=MissingReason.evaluator_error, detail=f"verifier result unreadable: {e}"
            )
        if found is None:
            tail = _tail(scratch.parent / f"{scratch.name}.verifier.stderr") or _tail(
                scratch.parent / f"{scratch.name}.verifier.stdout"
            )
            return Missing(
                reason=MissingReason.evaluator_error,
                detail=f"verifier exited with status {res.exit_code} and wrote no reward; last output: {tail!r}",
            )
        reward, passed, total, source = found
        return Scored(
            reward=apply_rule(task.reward_rule, reward, passed, total),
            rule=task.reward_rule,
            passed=passed,
            total=total,
            detail=f"from {source}; verifier exit status {res.exit_code}",
        )


def _tail(path: Path, n: int = 400) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
