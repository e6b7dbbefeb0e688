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
  ``PYTHONSAFEPATH=1`` (Python never puts the cwd, the harness's workspace,
  first on ``sys.path``);
- result: the one file the task names (``[gyre].result``: ``reward.txt``, the
  default and Harbor's convention, ``reward.json`` or ``junit.xml``), checked by
  :mod:`gyre.harness.results`; other files are ignored.

What is a zero and what is missing: once the verifier has run on the harness's
workspace, its outcome is the workspace's, because the workspace's code may be
what ran (pytest imports it): no result, an invalid one, a verifier past its
own timeout or flooding its log all score **0** (``detail`` says why), so a
harness cannot opt out of a zero by breaking the verifier. A workspace the
copy refuses (over ``max_copy_*``, unreadable entries) scores 0 too.
*Missing* stays for what the harness cannot cause: the caller's overall
budget, the host failing (copy destination, sandbox set-up, no ``bash``), a
task whose verifier needs the sandbox.

With the sandbox on, the verifier also sees Harbor's paths: the copy at
``/app`` (its cwd), the tests at ``/tests``, the result folder at
``/logs/verifier`` (the ``GYRE_*`` variables then point there), so a Harbor
``test.sh`` that hard-codes them runs unchanged.
Without the sandbox those paths are the host's own (a verifier would write the
host's ``/logs``), so a verifier whose files name them is refused: a missing
assessment saying to use the sandbox, and nothing is run.

Rule ``binary``: 1 if every test passed (or the reward is >= 1), else 0.
Rule ``fraction``: passed / total (or the reward, which the result check keeps in [0, 1]).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

from gyre.trace.assessment import Missing, MissingReason, Scored

from .config import ScorerConfig
from .process import run_process
from .results import RESULT_FILES, ResultError, read_result
from .safe_read import open_dir, printable
from .safecopy import CopyLimits, WorkspaceRefused, copy_workspace, remove_tree
from .sandbox import (
    HARBOR_APP,
    HARBOR_LOGS,
    HARBOR_TESTS,
    Confinement,
    bwrap_env,
    env_memfd,
    harbor_verifier_argv,
)
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


def _copy_tree(src: Path, dst: Path) -> None:
    """The task's own tests (trusted content, already checked by the task loader)."""
    shutil.copytree(src, dst, symlinks=True, dirs_exist_ok=False)


def _zero(task: Task, why: str) -> Scored:
    """A verifier run that produced no valid result: the workspace scores 0 (docs/harness.md)."""
    return Scored(reward=0.0, rule=task.reward_rule, detail=f"scored 0: {why}")


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
        self._removing: set[asyncio.Task[int]] = set()

    async def score(
        self, task: Task, workspace: Path, scratch: Path, timeout_s: float | None = None
    ) -> Scored | Missing:
        """Assess ``workspace`` by ``task``'s rule. ``timeout_s``: what is left of the overall budget.

        The verifier gets its own timeout, or what is left of the budget when that is
        shorter, counted from *before* the copy: the copy (bounded by ``max_copy_*``) never
        shortens the verifier's time.
        """
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
            try:
                return await self._score(
                    task, Path(workspace), Path(scratch), budget, cut_by_budget
                )
            finally:
                if not self.config.keep_scratch:
                    self._remove_later(scratch)

    def _remove_later(self, scratch: Path) -> None:
        """Remove the scoring folder on a worker thread while the assessment goes on: the
        removal takes ~20 ms on a loaded machine, which the execution's result need not wait
        for. :meth:`drain` (the executor's ``stop``) waits for what is still being removed."""
        t = asyncio.ensure_future(asyncio.to_thread(remove_tree, scratch))
        self._removing.add(t)
        t.add_done_callback(self._removing.discard)

    async def drain(self) -> None:
        """Wait until every scoring folder this scorer dropped is removed."""
        while self._removing:
            await asyncio.gather(*self._removing, return_exceptions=True)

    async def _prepare(self, task: Task, workspace: Path, scratch: Path) -> Scored | Missing | str:
        """The scoring copy; a note on skipped entries, or the assessment when it failed."""
        ws, tests = scratch / "workspace", scratch / "tests"
        try:
            if os.path.lexists(scratch):
                await asyncio.to_thread(remove_tree, scratch)
            scratch.mkdir(parents=True, mode=0o700)
        except OSError as e:
            return Missing(
                reason=MissingReason.infra_error, detail=f"could not prepare the scoring copy: {e}"
            )
        c = self.config
        limits = CopyLimits(c.max_copy_files, c.max_copy_bytes, c.max_copy_depth)
        try:
            rep = await asyncio.to_thread(copy_workspace, workspace, ws, limits)
        except WorkspaceRefused as e:  # the workspace's own doing: a zero, never missing
            return _zero(task, f"the workspace cannot be scored: {e}")
        except OSError as e:  # the host side (disk full): not the harness's
            return Missing(
                reason=MissingReason.infra_error,
                detail=f"could not copy the workspace: {printable(str(e))}",
            )
        try:
            await asyncio.to_thread(_copy_tree, task.tests_dir, tests)
            (scratch / "reward").mkdir()
            (scratch / "home").mkdir()
        except OSError as e:
            return Missing(
                reason=MissingReason.infra_error, detail=f"could not prepare the scoring copy: {e}"
            )
        if not rep.skipped_count:
            return ""
        return f"; {rep.skipped_count} FIFO/socket/device entries not copied ({', '.join(rep.skipped[:3])})"

    async def _score(
        self, task: Task, workspace: Path, scratch: Path, budget: float, cut: bool
    ) -> Scored | Missing:
        prepared = await self._prepare(task, workspace, scratch)
        if not isinstance(prepared, str):
            return prepared
        ws, tests, reward_dir, home = (
            scratch / "workspace",
            scratch / "tests",
            scratch / "reward",
            scratch / "home",
        )
        py_bin = str(Path(self.config.python).parent)
        env = {
            "PATH": f"{py_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(home),
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            # Python never puts the cwd (the harness's workspace) or a script's folder first on
            # sys.path, so a planted pytest.py is not imported as pytest; no user site-packages.
            "PYTHONSAFEPATH": "1",
            "PYTHONNOUSERSITE": "1",
            "GYRE_WORKSPACE": str(ws),
            "GYRE_TESTS_DIR": str(tests),
            "GYRE_REWARD_DIR": str(reward_dir),
            "GYRE_PYTHON": self.config.python,
            **task.verifier_env,
        }
        argv = ["bash", str(tests / "test.sh")]
        userns_fd: int | None = None
        env_fd: int | None = None
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
                        reason=MissingReason.infra_error,
                        detail=f"sandbox setup failed: {printable(str(e))}",
                    )
            # Harbor's paths too: /app (workspace copy), /tests, /logs/verifier; no network.
            assert self._bwrap  # sandboxed
            env.update(
                GYRE_WORKSPACE=HARBOR_APP, GYRE_TESTS_DIR=HARBOR_TESTS, GYRE_REWARD_DIR=HARBOR_LOGS
            )
            # The verifier's environment (the task's [verifier.env] among it) reaches only the
            # sandbox, never the host-side bwrap process (gyre.harness.sandbox, "Environment").
            try:
                env_fd = env_memfd(env)
            except OSError as e:
                if userns_fd is not None:
                    os.close(userns_fd)
                return Missing(
                    reason=MissingReason.infra_error, detail=f"sandbox setup failed: {e}"
                )
            env = bwrap_env()
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
                    env_fd=env_fd,
                )
            except BaseException:  # cancelled or failed before the try below owns these
                _close(userns_fd, env_fd)
                raise
        # The reward folder as it is now: whatever the verifier does to its path, the result
        # is read from this folder, by name, without following a link (gyre.harness.safe_read).
        try:
            reward_fd = open_dir(reward_dir)
        except OSError as e:
            _close(userns_fd, env_fd)
            return Missing(reason=MissingReason.infra_error, detail=f"reward folder: {e}")
        try:
            fds = tuple(fd for fd in (userns_fd, env_fd) if fd is not None)
            return await self._verify(
                task, argv, ws, env, scratch, budget, cut, fds, reward_fd, prepared
            )
        finally:
            os.close(reward_fd)

    async def _verify(
        self,
        task: Task,
        argv: list[str],
        ws: Path,
        env: dict[str, str],
        scratch: Path,
        budget: float,
        cut: bool,
        fds: tuple[int, ...],
        reward_fd: int,
        note: str,
    ) -> Scored | Missing:
        """Run the verifier; its result file, checked, becomes the assessment. ``fds``: the
        sandbox's user namespace and environment, passed to it and closed here."""
        logs = (
            scratch.parent / f"{scratch.name}.verifier.stdout",
            scratch.parent / (f"{scratch.name}.verifier.stderr"),
        )
        try:
            res = await run_process(
                argv,
                cwd=ws,
                env=env,
                stdout_path=logs[0],
                stderr_path=logs[1],
                timeout_s=budget,
                max_log_bytes=self.config.max_log_bytes,
                pass_fds=fds,
            )
        except OSError as e:
            return Missing(
                reason=MissingReason.evaluator_error, detail=f"could not start the verifier: {e}"
            )
        finally:
            _close(*fds)
        if res.stop == "timeout" and cut:  # the caller's budget, shorter than the verifier's own
            return Missing(
                reason=MissingReason.overall_timeout,
                detail=f"the overall budget ran out while the verifier ran ({budget:.1f}s)",
            )
        if res.stop in ("timeout", "log_limit"):  # the workspace's code may hang or flood it
            what = "flooded its log" if res.stop == "log_limit" else f"ran past {budget:.1f}s"
            return _zero(task, f"the verifier {what} and was killed{note}")
        name = task.result_file
        try:
            found = await asyncio.to_thread(read_result, reward_fd, name)
        except ResultError as e:
            return _zero(task, f"invalid verifier result: {e}{note}")
        if found is None:
            others = await asyncio.to_thread(_present, reward_fd, name)
            hint = (
                f" (it wrote {', '.join(others)}: the task reads only {name}, set [gyre].result)"
                if others
                else ""
            )
            tail = await asyncio.to_thread(_tail, logs[1]) or await asyncio.to_thread(
                _tail, logs[0]
            )
            return _zero(
                task,
                f"the verifier exited with status {res.exit_code} and wrote no {name}{hint}; "
                f"last output: {tail!r}{note}",
            )
        return Scored(
            reward=apply_rule(task.reward_rule, found.reward, found.passed, found.total),
            rule=task.reward_rule,
            passed=found.passed,
            total=found.total,
            detail=f"from {found.source}; verifier exit status {res.exit_code}{note}",
        )


def _close(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None:
            os.close(fd)


def _present(dir_fd: int, but: str) -> list[str]:
    """The other result files the verifier wrote (for the hint); never follows a link."""
    out = []
    for n in RESULT_FILES:
        if n == but:
            continue
        try:
            os.stat(n, dir_fd=dir_fd, follow_symlinks=False)
            out.append(n)
        except OSError:
            pass
    return out


def _tail(path: Path, n: int = 160) -> str:
    """The last ``n`` bytes of a verifier log (a file the scorer itself created)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return ""
        os.lseek(fd, max(0, st.st_size - n), os.SEEK_SET)
        return os.read(fd, n).decode("utf-8", "replace").strip()
    except OSError:
        return ""
    finally:
        os.close(fd)
