"""The harness executor: one fresh workspace, one harness process, one assessment per execution.

It runs each execution in numbered steps: its folder (:mod:`.workspace`), its key and
command line (:mod:`.command`), the sandbox (:mod:`.launch`), the harness, then its
assessment; what it takes and leaves is :mod:`.execution`'s.

Lifecycle: ``await ex.start()`` ... ``await ex.run(spec)`` (many at once, up to
``max_concurrency`` harnesses live) ... ``await ex.stop()`` (kills what is
still running). No global state: two executors in one process do not interact.

Timeout semantics (the paper's partial scoring):

- harness timeout -> the whole process group is killed, the workspace kept,
  and scored by the task's normal rule; the reward never looks at the exit
  status or the elapsed time;
- the overall budget (per task, counted from launch; or an absolute deadline
  from the caller) running out -- before the harness is done, or during
  scoring -- is a ``Missing`` assessment, as is a harness that could not be
  launched at all; a verifier the workspace breaks (crash, hang, invalid
  result) scores 0 (``gyre.harness.scorer``: only what the harness cannot cause
  is missing);
- an unexpected exception of one execution is that execution's recorded
  result (``Missing(infra_error)``, "internal error: ..."), never the caller's.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from gyre.trace.assessment import Missing, MissingReason, Scored

from .command import bridge_target, command_line, write_files
from .config import ExecutorConfig
from .execution import ExecutionError, ExecutionResult, ExecutionSpec, HarnessRun, Timings
from .hostguard import (
    HostSetupError,
    private_dir,
    working_bwrap,
)
from .launch import Abort, Exec, Launch, open_bridge, sandbox, undo_sandbox
from .model_calls import CALLS_FILE_NAME, CallsVerdict, ModelCalls, decide, read_calls_report
from .process import ProcessResult, run_process
from .profiles import ProfileError
from .safe_read import quote
from .safecopy import remove_tree
from .sandbox import Confinement
from .scorer import Scorer
from .workspace import fresh_workspace

# (execution_id, label) -> API key for that execution (e.g. the proxy's admin registration).
RegisterKey = Callable[[str, str], Awaitable[str]]
# execution_id -> that execution's model calls as the proxy counted them (None: unknown).
CountCalls = Callable[[str], Awaitable[ModelCalls | None]]
# execution_id -> revoke its API key (the proxy's admin route): called once its harness stopped.
RevokeKey = Callable[[str], Awaitable[object]]
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class _Finish(Protocol):
    """``run``'s closure that turns an assessment into the execution's result (and writes it)."""

    def __call__(self, assessment: Scored | Missing, write: bool = True) -> ExecutionResult: ...


class HarnessExecutor:
    def __init__(
        self,
        config: ExecutorConfig | None = None,
        *,
        register: RegisterKey | None = None,
        calls: CountCalls | None = None,
        revoke: RevokeKey | None = None,
    ) -> None:
        self.config = config or ExecutorConfig()
        self._register = register
        self._calls = calls
        self._revoke = revoke
        self._sem: asyncio.Semaphore | None = None
        self._scorer: Scorer | None = None
        self._bwrap: str | None = None
        self._inflight: set[asyncio.Task] = set()
        self._stopping = False
        self._ids: set[str] = set()

    # ---- lifecycle -------------------------------------------------------------
    async def start(self) -> None:
        cfg = self.config
        try:
            private_dir(cfg.workspace_root)
        except HostSetupError as e:
            raise ExecutionError(str(e)) from None
        if cfg.sandbox.enabled:
            try:
                self._bwrap = await asyncio.to_thread(working_bwrap, cfg.sandbox)
            except HostSetupError as e:
                raise ExecutionError(str(e)) from None
        self._sem = asyncio.Semaphore(cfg.max_concurrency)
        self._scorer = Scorer(
            cfg.scorer,
            bwrap=self._bwrap,
            hide=[cfg.workspace_root.resolve(), *cfg.sandbox.hide_paths],
            confine=self._confinement(),
        )

    async def stop(self) -> None:
        """Stop every running execution (process groups killed, workspaces kept) and wait.

        Their ``run`` calls return a ``Missing(cancelled)`` result (written to
        ``result.json`` like any other), so a stop loses no record.
        """
        self._stopping = True
        tasks = list(self._inflight)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._scorer is not None:
            await self._scorer.drain()  # scoring folders still being removed
        self._sem = None
        self._stopping = False

    @property
    def running(self) -> int:
        return len(self._inflight)

    async def __aenter__(self) -> HarnessExecutor:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ---- one execution --------------------------------------------------------
    async def run(self, spec: ExecutionSpec) -> ExecutionResult:
        """Run one execution to its assessment. Never raises for harness or verifier failures.

        The execution runs in its own task, so ``stop()`` cancels only it, never
        the caller; cancelling the caller cancels the execution (its process
        group is killed) and re-raises.
        """
        if self._sem is None or self._scorer is None:
            raise ExecutionError("executor not started (await executor.start() first)")
        if spec.execution_id in self._ids:
            raise ExecutionError(
                f"execution id {spec.execution_id!r} was already used by this executor"
            )
        self._ids.add(spec.execution_id)
        sem = self._sem
        t_submit = time.monotonic()

        async def body() -> ExecutionResult:
            try:
                await sem.acquire()
            except asyncio.CancelledError:
                if not self._stopping:
                    raise
                return ExecutionResult(  # stopped while queued: nothing was started
                    execution_id=spec.execution_id,
                    task=spec.task.name,
                    profile=spec.profile.name,
                    assessment=Missing(
                        reason=MissingReason.cancelled, detail="executor stopped before launch"
                    ),
                    harness=HarnessRun(),
                    workspace="",
                    execution_dir="",
                    timings=Timings(
                        queued_s=time.monotonic() - t_submit, total_s=time.monotonic() - t_submit
                    ),
                )
            try:
                return await self._run(spec, t_submit)
            finally:
                sem.release()

        inner = asyncio.get_running_loop().create_task(body())
        self._inflight.add(inner)
        inner.add_done_callback(self._inflight.discard)
        return await inner

    async def run_many(self, specs: list[ExecutionSpec]) -> list[ExecutionResult]:
        return list(await asyncio.gather(*(self.run(s) for s in specs)))

    async def _run(self, spec: ExecutionSpec, t_submit: float) -> ExecutionResult:
        cfg, task, prof = self.config, spec.task, spec.profile
        t_launch = time.monotonic()
        timings = Timings(queued_s=t_launch - t_submit)
        overall = (
            spec.overall_timeout_s
            or task.overall_timeout_s
            or (task.harness_timeout_s + task.verifier_timeout_s + cfg.overall_slack_s)
        )
        deadline = t_launch + overall
        if spec.deadline is not None:
            deadline = min(deadline, spec.deadline)
        exec_dir = (cfg.workspace_root / (_SAFE.sub("_", spec.execution_id) or "_")).resolve()
        ws, inputs, artifacts, home = (
            exec_dir / "workspace",
            exec_dir / "input",
            exec_dir / "artifacts",
            exec_dir / "home",
        )
        run = HarnessRun(
            stdout_path=str(exec_dir / "harness.stdout"),
            stderr_path=str(exec_dir / "harness.stderr"),
        )

        def result(assessment: Scored | Missing, write: bool = True) -> ExecutionResult:
            now = time.monotonic()
            timings.total_s = now - t_submit
            if x.call_times is not None:  # the harness's word: kept only if it fits the run
                first, last = x.call_times
                if t_launch <= first <= last <= now:
                    timings.first_call_s = first - t_launch
                    timings.after_last_call_s = now - last
            r = ExecutionResult(
                execution_id=spec.execution_id,
                task=task.name,
                profile=prof.name,
                assessment=assessment,
                harness=run,
                workspace=str(ws),
                execution_dir=str(exec_dir),
                timings=timings,
            )
            if write:  # never into a folder this execution did not create
                try:
                    (exec_dir / "result.json").write_text(r.model_dump_json(indent=2))
                except (OSError, ValueError):  # ValueError: a string that is not UTF-8
                    pass
            return r

        x = Exec(
            spec, t_launch, deadline, overall, exec_dir, ws, inputs, artifacts, home, run, timings
        )
        try:
            return await self._execute(x, result)
        except asyncio.CancelledError:
            if not self._stopping:
                raise
            run.error = run.error or "executor stopped while the execution was running"
            return result(Missing(reason=MissingReason.cancelled, detail=run.error))
        except Exception as e:  # a Gyre bug: this execution's record, never the run's end
            run.error = f"internal error: {type(e).__name__}: {quote(str(e), 200)}"
            # input/ exists only if this execution made its folder (a stale one is refused first)
            mine = await asyncio.to_thread(os.path.isdir, inputs)
            return result(Missing(reason=MissingReason.infra_error, detail=run.error), write=mine)

    async def _execute(self, x: Exec, result: _Finish) -> ExecutionResult:
        """Fresh workspace, key and command line, sandbox, the harness, then its assessment."""
        run = x.run
        try:
            await fresh_workspace(x)
            launch = await self._launch(x)
            if self._bwrap:
                await sandbox(self.config, self._bwrap, self._confinement(), x, launch)
            pres, cut_by_overall = await self._harness(x, launch)
        except Abort as a:
            if a.stop is not None:
                run.stop = a.stop
            run.error = a.detail
            return result(Missing(reason=a.reason, detail=a.detail), write=a.write)
        self._record_stop(x, pres, cut_by_overall)
        if run.stop == "overall_timeout":
            await self._revoke_key(x.spec.execution_id)
            return result(
                Missing(
                    reason=MissingReason.overall_timeout,
                    detail=f"overall budget ({x.overall:.1f}s) ran out while the harness was running",
                )
            )
        # Did the policy act? Only what the harness cannot forge drops it unscored (model_calls.py).
        run.model_calls, verdict = await self._model_calls(x)
        # The harness is done, its key too: a child that outlived it (setsid, unsandboxed)
        # must not call the policy during scoring and land in the trace. (After the count:
        # the proxy forgets an execution's counts with its keys.)
        await self._revoke_key(x.spec.execution_id)
        if verdict == "drop":
            assert run.model_calls is not None
            return result(
                Missing(reason=MissingReason.model_unreachable, detail=run.model_calls.detail())
            )
        assessment = await self._score(x)
        if verdict == "drop_if_positive" and run.model_calls is not None:
            assessment = _unverified_unreachable(assessment, run.model_calls)
        return result(assessment)

    async def _launch(self, x: Exec) -> Launch:
        """2. The execution's API key, its command line and the profile's config files."""
        spec, run = x.spec, x.run
        key = spec.api_key
        if key is None:
            try:
                if self._register is None:
                    raise ExecutionError(
                        "no api_key in the spec and no register hook on the executor"
                    )
                key = await self._register(
                    spec.execution_id, spec.label or f"{spec.task.name}/{spec.profile.name}"
                )
            except Exception as e:  # proxy down, HTTP error, no hook
                raise Abort(
                    MissingReason.launch_failed,
                    f"key registration failed: {type(e).__name__}: {e}",
                    stop="launch_failed",
                ) from None
        try:
            proxy_only = bool(self._bwrap) and self.config.sandbox.network == "proxy-only"
            bridge = bridge_target(spec.base_url) if proxy_only else None
            base_url = spec.base_url if bridge is None else bridge[2]
            # Off the loop: the npm harness lookups stat a dozen paths (docs/runtime.md).
            argv, env, home_files = await asyncio.to_thread(
                command_line, x, base_url, key, bool(self._bwrap)
            )
        except (ProfileError, ExecutionError) as e:
            raise Abort(MissingReason.launch_failed, str(e), stop="launch_failed") from None
        # The profile's config files: straight into HOME, or (sandbox: HOME is a tmpfs made at
        # start) under the read-only inputs, copied into HOME inside by gyre.harness.homeseed.
        try:
            await asyncio.to_thread(write_files, self._seed_dir(x), home_files)
        except OSError as e:
            raise Abort(
                MissingReason.infra_error, f"harness config files could not be written: {e}"
            ) from None
        run.argv = argv
        if shutil.which(argv[0], path=env.get("PATH")) is None:
            raise Abort(
                MissingReason.launch_failed,
                f"harness command not found or not executable: {argv[0]!r}",
                stop="launch_failed",
            )
        return Launch(argv, env, home_files, bridge)

    def _seed_dir(self, x: Exec) -> Path:
        return x.inputs / "home" if self._bwrap else x.home

    async def _harness(self, x: Exec, launch: Launch) -> tuple[ProcessResult, bool]:
        """3. The harness, until it exits, its timeout, the overall deadline, or a log flood;
        then the sandbox's pieces are undone. Returns the process result and whether the
        overall budget, not the harness timeout, set its time limit."""
        cfg, sb, run = self.config, self.config.sandbox, x.run
        harness_timeout = x.spec.harness_timeout_s or x.spec.task.harness_timeout_s
        now = time.monotonic()
        timeout = min(harness_timeout, x.deadline - now)
        cut_by_overall = x.deadline - now < harness_timeout
        x.timings.setup_s = now - x.t_launch
        started = asyncio.get_running_loop().create_future()
        try:
            if launch.forwarder is not None:
                await launch.forwarder.start()
                if os.geteuid() == 0 and launch.sock_dir is not None:
                    open_bridge(launch.sock_dir, sb.gid)
            pres = await run_process(
                launch.argv,
                cwd=x.ws,
                env=launch.env,
                stdout_path=Path(run.stdout_path),
                stderr_path=Path(run.stderr_path),
                timeout_s=timeout,
                max_log_bytes=cfg.max_log_bytes,
                kill_grace_s=cfg.kill_grace_s,
                on_start=started,
                pass_fds=tuple(fd for fd in (launch.userns_fd, launch.env_fd) if fd is not None),
                abort=launch.watcher,
            )
        except OSError as e:
            raise Abort(
                MissingReason.launch_failed, f"harness could not start: {e}", stop="launch_failed"
            ) from None
        finally:
            await undo_sandbox(x, launch)
        return pres, cut_by_overall

    def _record_stop(self, x: Exec, pres: ProcessResult, cut_by_overall: bool) -> None:
        """How the harness stopped, into the execution's record and timings."""
        cfg, run, timings = self.config, x.run, x.timings
        timings.harness_s = pres.wall_s
        timings.launched_s = timings.queued_s + (pres.started_at - x.t_launch)
        run.exit_code, run.log_truncated = pres.exit_code, pres.truncated
        if pres.stop == "timeout":
            run.stop = "overall_timeout" if cut_by_overall else "harness_timeout"
        else:
            # exited | log_limit | disk_limit (run_process re-raises a cancellation, never returns it)
            assert pres.stop != "cancelled"
            run.stop = pres.stop
        if pres.stop == "log_limit":
            run.error = (
                f"harness wrote more than {cfg.max_log_bytes} bytes to a stream and was stopped"
            )
        elif pres.stop == "disk_limit":
            sb = cfg.sandbox
            run.error = (
                f"harness's workspace grew past {sb.max_workspace_bytes} bytes or "
                f"{sb.max_workspace_files} entries and it was stopped"
            )
        timings.teardown_s = pres.kill_s

    async def _score(self, x: Exec) -> Scored | Missing:
        """4. Score a copy of the workspace with the hidden tests (own process, own timeout)."""
        t_score = time.monotonic()
        left = x.deadline - t_score
        scorer = self._scorer
        assert scorer is not None  # run() refuses to start an execution before start()
        assessment = await scorer.score(x.spec.task, x.ws, x.exec_dir / "scoring", timeout_s=left)
        x.timings.scoring_s = time.monotonic() - t_score
        if not self.config.keep_workspaces:
            await asyncio.to_thread(remove_tree, x.ws)
        return assessment

    async def _revoke_key(self, execution_id: str) -> None:
        if self._revoke is None:
            return
        try:
            await self._revoke(execution_id)
        except Exception:  # the proxy is gone: nothing can call it either
            pass

    async def _model_calls(self, x: Exec) -> tuple[ModelCalls | None, CallsVerdict]:
        """The counts to record and what they decide (``model_calls.decide``): the proxy's,
        when the ``calls`` hook answers, and the harness's own file, which only adds
        information (read bounded, without following links, off the loop)."""
        proxy: ModelCalls | None = None
        if self._calls is not None:
            try:
                proxy = await self._calls(x.spec.execution_id)
            except Exception:  # the admin call failed: nothing the proxy says
                proxy = None
        own, x.call_times = await asyncio.to_thread(
            read_calls_report, x.artifacts / CALLS_FILE_NAME
        )
        return decide(proxy, own)

    def _confinement(self) -> Confinement:
        sb = self.config.sandbox
        return Confinement(
            uid=sb.uid,
            gid=sb.gid,
            max_procs=sb.max_procs,
            max_file_bytes=sb.max_file_bytes,
            tmpfs_bytes=sb.tmpfs_bytes,
        )


def _unverified_unreachable(a: Scored | Missing, calls: ModelCalls) -> Scored | Missing:
    """A report of "no call answered" that nobody but the harness can vouch for: it drops a
    success (not evidence about the policy) and leaves a zero a zero, noted in its detail."""
    if not isinstance(a, Scored):
        return a
    if a.reward > 0:
        return Missing(
            reason=MissingReason.model_unreachable,
            detail=f"{calls.detail()}; its workspace scored {a.reward:.4g}, not kept",
        )
    return a.model_copy(update={"detail": f"{a.detail}; {calls.detail()}"})
