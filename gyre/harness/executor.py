"""The harness executor: one fresh workspace, one harness process, one assessment per execution.

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
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal, Protocol
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field

from gyre.trace.assessment import Assessment, Missing, MissingReason, Scored

from .config import ExecutorConfig
from .hostguard import (
    HostSetupError,
    private_dir,
    working_bwrap,
)
from .launch import Abort, Exec, Launch, sandbox, undo_sandbox
from .model_calls import (
    CALLS_FILE_ENV,
    CALLS_FILE_NAME,
    CallsVerdict,
    ModelCalls,
    decide,
    read_calls_file,
)
from .process import ProcessResult, run_process
from .profiles import HarnessProfile, ProfileError, find_npm_harness
from .safe_read import quote
from .safecopy import remove_tree
from .sandbox import SANDBOX_HOME, Confinement
from .scorer import Scorer
from .task import Task

# (execution_id, label) -> API key for that execution (e.g. the proxy's admin registration).
RegisterKey = Callable[[str, str], Awaitable[str]]
# execution_id -> that execution's model calls as the proxy counted them (None: unknown).
CountCalls = Callable[[str], Awaitable[ModelCalls | None]]
# execution_id -> revoke its API key (the proxy's admin route): called once its harness stopped.
RevokeKey = Callable[[str], Awaitable[object]]
_SAFE = re.compile(r"[^A-Za-z0-9._-]")
HarnessStop = Literal[
    "exited",
    "harness_timeout",
    "overall_timeout",
    "log_limit",
    "disk_limit",
    "launch_failed",
    "not_run",
]


class _Finish(Protocol):
    """``run``'s closure that turns an assessment into the execution's result (and writes it)."""

    def __call__(self, assessment: Scored | Missing, write: bool = True) -> ExecutionResult: ...


class ExecutionError(RuntimeError):
    """A caller error (executor not started, duplicate execution id)."""


class ExecutionSpec(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    execution_id: str
    task: Task
    profile: HarnessProfile
    base_url: str
    api_key: str | None = None  # None: obtained from the executor's ``register`` hook
    model: str | None = None  # overrides the profile's model name
    overall_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False)  # overrides the task's
    harness_timeout_s: float | None = Field(None, gt=0, allow_inf_nan=False)  # overrides the task's
    deadline: float | None = Field(None, allow_inf_nan=False)  # absolute time.monotonic() deadline
    extra_env: dict[str, str] = Field(default_factory=dict)
    label: str | None = None


class HarnessRun(BaseModel):
    argv: list[str] = Field(default_factory=list)
    stop: HarnessStop = "not_run"
    exit_code: int | None = None
    error: str = ""
    stdout_path: str = ""
    stderr_path: str = ""
    log_truncated: bool = False
    model_calls: ModelCalls | None = None  # None: nobody counted (no proxy hook, no harness file)


class Timings(BaseModel):
    queued_s: float = 0.0  # waiting for a slot
    setup_s: float = 0.0  # workspace copy, key, command line
    launched_s: float = (
        0.0  # from submission until the harness process existed (queue + setup + spawn)
    )
    harness_s: float = 0.0
    teardown_s: float = 0.0  # process-group kill and log flush after the harness stopped
    scoring_s: float = 0.0
    total_s: float = 0.0


class ExecutionResult(BaseModel):
    execution_id: str
    task: str
    profile: str
    assessment: Assessment
    harness: HarnessRun
    workspace: str
    execution_dir: str
    timings: Timings

    @property
    def reward(self) -> float | None:
        """The reward, or None when the assessment is missing (never 0 for missing)."""
        return self.assessment.reward if isinstance(self.assessment, Scored) else None


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
            timings.total_s = time.monotonic() - t_submit
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
            await self._fresh_workspace(x)
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
        run.model_calls, verdict = await self._model_calls(x.spec.execution_id, x.artifacts)
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

    async def _fresh_workspace(self, x: Exec) -> None:
        """1. The execution's own folder: workspace (the task's repository), inputs, HOME."""
        if x.exec_dir.exists():
            raise Abort(
                MissingReason.infra_error,
                f"execution folder {x.exec_dir} already exists (stale run with the same id?); "
                "left untouched",
                write=False,
            )
        try:
            await asyncio.to_thread(
                self._prepare,
                x.spec.task,
                x.spec.profile,
                x.exec_dir,
                x.ws,
                x.inputs,
                x.artifacts,
                x.home,
            )
        except OSError as e:
            raise Abort(MissingReason.infra_error, f"workspace setup failed: {e}") from None

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
            bridge = self._bridge_target(spec.base_url)
            base_url = spec.base_url if bridge is None else bridge[2]
            # Off the loop: the npm harness lookups stat a dozen paths (docs/runtime.md).
            argv, env, home_files = await asyncio.to_thread(
                self._command, spec, base_url, key, x.ws, x.inputs, x.artifacts, x.home
            )
        except (ProfileError, ExecutionError) as e:
            raise Abort(MissingReason.launch_failed, str(e), stop="launch_failed") from None
        # The profile's config files: straight into HOME, or (sandbox: HOME is a tmpfs made at
        # start) under the read-only inputs, copied into HOME inside by gyre.harness.homeseed.
        try:
            await asyncio.to_thread(_write_files, self._seed_dir(x), home_files)
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
                    for p in (launch.sock_dir, launch.sock_dir / "p.sock"):
                        os.chown(p, sb.uid, sb.gid)
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
                pass_fds=() if launch.userns_fd is None else (launch.userns_fd,),
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

    async def _model_calls(
        self, execution_id: str, artifacts: Path
    ) -> tuple[ModelCalls | None, CallsVerdict]:
        """The counts to record and what they decide (``model_calls.decide``): the proxy's,
        when the ``calls`` hook answers, and the harness's own file, which only adds
        information (read bounded, without following links, off the loop)."""
        proxy: ModelCalls | None = None
        if self._calls is not None:
            try:
                proxy = await self._calls(execution_id)
            except Exception:  # the admin call failed: nothing the proxy says
                proxy = None
        own = await asyncio.to_thread(read_calls_file, artifacts / CALLS_FILE_NAME)
        return decide(proxy, own)

    @staticmethod
    def _prepare(
        task: Task,
        prof: HarnessProfile,
        exec_dir: Path,
        ws: Path,
        inputs: Path,
        artifacts: Path,
        home: Path,
    ) -> None:
        exec_dir.mkdir(mode=0o700)  # the workspace root is checked private by start()
        skip = task.skip_files
        shutil.copytree(
            task.repository,
            ws,
            symlinks=True,
            ignore=(lambda d, names: [n for n in names if n in skip]) if skip else None,
        )
        inputs.mkdir()
        (inputs / "instruction.md").write_text(task.instruction + "\n", encoding="utf-8")
        if prof.needs_solution:
            if task.solution_dir is None:
                raise FileNotFoundError(
                    f"profile {prof.name!r} needs a solution/ folder; task {task.name} has none"
                )
            shutil.copytree(task.solution_dir, inputs / "solution", symlinks=True)
        artifacts.mkdir()
        home.mkdir()

    def _confinement(self) -> Confinement:
        sb = self.config.sandbox
        return Confinement(
            uid=sb.uid,
            gid=sb.gid,
            max_procs=sb.max_procs,
            max_file_bytes=sb.max_file_bytes,
            tmpfs_bytes=sb.tmpfs_bytes,
        )

    def _bridge_target(self, base_url: str) -> tuple[str, int, str] | None:
        """(proxy host, port, base URL as the sandboxed harness sees it) in proxy-only mode, else None."""
        if not self._bwrap or self.config.sandbox.network != "proxy-only":
            return None
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ExecutionError(
                f"proxy-only sandbox network needs an http:// base URL, got {base_url!r}"
            )
        port = u.port or 80
        # The bridge listens inside as the unprivileged sandbox user: a port below 1024 cannot
        # be bound there, so it is moved up (the harness only ever sees the URL).
        inside = port if port >= 1024 else 20000 + port
        return (
            u.hostname,
            port,
            urlunsplit(("http", f"127.0.0.1:{inside}", u.path, u.query, u.fragment)),
        )

    def _command(
        self,
        spec: ExecutionSpec,
        base_url: str,
        key: str,
        ws: Path,
        inputs: Path,
        artifacts: Path,
        home: Path,
    ) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """argv, environment and the profile's rendered ``home_files`` for one execution."""
        base = base_url.rstrip("/")
        root = base[: -len("/v1")] if base.endswith("/v1") else base
        prof = spec.profile
        values = {
            "instruction": spec.task.instruction,
            "instruction_file": str(inputs / "instruction.md"),
            "workspace": str(ws),
            "artifacts": str(artifacts),
            "home": SANDBOX_HOME if self._bwrap else str(home),
            "base_url": base_url,
            "openai_base_url": root + "/v1",
            "anthropic_base_url": root,
            "api_key": key,
            "model": spec.model or prof.model,
            "python": sys.executable,
            "python_bin": str(Path(sys.executable).parent),
            "claude": find_npm_harness("claude") or "claude",
            "qwen": find_npm_harness("qwen") or "qwen",
            "codex": find_npm_harness("codex") or "codex",
            "solution_dir": str(inputs / "solution"),
            "execution_id": spec.execution_id,
            "task": spec.task.name,
        }
        argv, penv = prof.render(values)
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env = {
            "PATH": f"{values['python_bin']}:{path}",
            "HOME": values["home"],
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "TERM": "dumb",
            "NO_COLOR": "1",
            "PYTHONUNBUFFERED": "1",
            "OPENAI_BASE_URL": values["openai_base_url"],
            "OPENAI_API_KEY": key,
            "ANTHROPIC_BASE_URL": values["anthropic_base_url"],
            "ANTHROPIC_API_KEY": key,
            "GYRE_EXECUTION_ID": spec.execution_id,
            "GYRE_TASK": spec.task.name,
            CALLS_FILE_ENV: str(artifacts / CALLS_FILE_NAME),
            **penv,
            **spec.extra_env,
        }
        return argv, env, prof.render_home_files(values)


def _write_files(root: Path, files: dict[str, str]) -> None:
    """Write ``files`` (relative path -> text) under ``root``, making folders as needed."""
    for rel, text in files.items():
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text, encoding="utf-8")


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


def load_result(path: str | Path) -> ExecutionResult:
    """Read a ``result.json`` written by the executor."""
    return ExecutionResult.model_validate(json.loads(Path(path).read_text()))
