"""Executions of the run: harness processes through the proxy, their rewards, and their groups.

Each execution gets its own proxy key (managed mode), so its trace lands in its
own file; when the harness is done the executor scores the workspace (a harness
timeout is still scored; a missing assessment stays missing, never zero). A
group's N traces and rewards become a :class:`~gyre.train.buffer.ReadyGroup`
when the policy assigns it to a step (trajectory trees, admission by role with
J_max), and are packed into micro-steps. Evaluation executions use the same
machinery under their own ids and never enter the policy.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gyre.harness.execution import ExecutionSpec
from gyre.harness.executor import HarnessExecutor
from gyre.harness.model_calls import ModelCalls
from gyre.harness.profiles import HarnessProfile, load_profile
from gyre.harness.roles import role_profile
from gyre.runtime.config import GyreConfig
from gyre.runtime.longtail import LongTail
from gyre.runtime.managed_proxy import ManagedProxy
from gyre.runtime.restore import Restored
from gyre.runtime.rundir import RunDir
from gyre.runtime.tasks import TaskStream
from gyre.trace.agentstats import timeout_sums, tree_sums, turn_sums
from gyre.trace.assessment import Missing, reward_of
from gyre.trace.store import read_trace, trace_path
from gyre.trace.toolhealth import ToolHealth, execution_health
from gyre.train.buffer import pack_groups
from gyre.train.groups import group_from_traces


class ExecutionRunner:
    """Runs the run's executions (harness processes, each with its own proxy key), scores
    them, and turns a group's traces into micro-step tasks; evaluation runs too. Named apart
    from :class:`gyre.proxy.executions.Executions`, the proxy's table of live execution keys."""

    def __init__(
        self,
        cfg: GyreConfig,
        rundir: RunDir,
        tasks: TaskStream,
        proxy: ManagedProxy,
        *,
        segment: int = 0,
    ):
        """``proxy``: the run's proxy the harnesses call (its admin calls register them)."""
        self.cfg, self.rundir, self.tasks, self.segment = cfg, rundir, tasks, segment
        self.proxy = proxy
        self.executor: HarnessExecutor | None = None
        self.profile: HarnessProfile | None = None
        self.results: dict[tuple[int, int], tuple[str, float | Missing]] = {}
        # (gid, attempt) -> how its harness stopped, until its group is packed (agent/* metrics;
        # a resume's restored executions have none)
        self.stops: dict[tuple[int, int], str] = {}
        self.finished = 0
        self.failed = 0  # harness exited non-zero, was killed, or could not launch
        self.missing = 0
        self.missing_reasons: dict[str, int] = {}  # reason -> executions (run summary)
        self.running = 0
        self._last_eval = -1
        self.eval_tasks: set[asyncio.Task] = set()
        self.eval_live = 0  # evaluation executions running (no group holds them)
        # told each change of eval_live: the world reports it to the policy (EvaluationRunning)
        self.on_eval_live: Callable[[int], None] = lambda n: None
        lt = cfg.run.longtail
        self.longtail = (
            None
            if lt is None
            else LongTail(
                lt, cfg.seed, cfg.policy.total_steps, cfg.policy.batch_groups, cfg.policy.group_size
            )
        )

    async def start(self) -> None:
        prof = load_profile(self.cfg.run.profile)
        self.profile = prof.model_copy(update={"args": [*prof.args, *self.cfg.run.harness_args]})
        ecfg = self.cfg.executor.model_copy(update={"workspace_root": self.rundir.workspaces})
        self.executor = HarnessExecutor(
            ecfg, register=self._register, calls=self._calls, revoke=self._revoke
        )
        await self.executor.start()

    def _started(self) -> tuple[HarnessExecutor, HarnessProfile]:
        """Executor and profile: built by ``start()``."""
        if self.executor is None or self.profile is None:
            raise RuntimeError("ExecutionRunner.start() was not called")
        return self.executor, self.profile

    async def stop(self) -> None:
        for t in list(self.eval_tasks):
            t.cancel()
        if self.executor is not None:
            await self.executor.stop()

    async def _register(self, execution_id: str, label: str) -> str:
        return await self.proxy.register(execution_id, label)

    async def _revoke(self, execution_id: str) -> None:
        """The key dies with the harness (before scoring: no survivor lands in the trace)."""
        await self.proxy.revoke(execution_id)

    async def _calls(self, execution_id: str) -> Any:
        """The proxy's count of this execution's model calls (did the policy act at all?)."""
        d = await self.proxy.calls(execution_id)
        return ModelCalls(
            attempted=int(d["attempted"]),
            answered=int(d["answered"]),
            last_error=str(d.get("last_error", "")),
            source="proxy",
        )

    async def _run_one(
        self, execution_id: str, task, extra_env: dict[str, str] | None = None
    ) -> Any:
        executor, profile = self._started()
        run, lt = self.cfg.run, self.cfg.run.longtail
        spec = ExecutionSpec(
            execution_id=execution_id,
            task=task,
            profile=profile,
            base_url=self.proxy.url,
            harness_timeout_s=run.harness_timeout_s
            or (self.longtail.executor_harness_timeout_s if self.longtail else None),
            overall_timeout_s=run.overall_timeout_s or (lt.overall_timeout_s if lt else None),
            extra_env=extra_env or {},
        )
        res = await executor.run(spec)
        try:  # the proxy closes the execution's trace file and forgets its key
            await self.proxy.revoke(execution_id)
        # the proxy down past the admin retry, stopped (the run ends), or refusing: the key
        # dies with the proxy anyway, and the execution's result stands
        except (httpx.HTTPError, RuntimeError):
            pass
        return res

    def restore(self, kept: Restored) -> None:
        """A resume's execution that finished before the driver died: its outcome and trace
        (under its own id) go to its group as they are; it is not logged again."""
        self.results[(kept.group, kept.attempt)] = (kept.execution, kept.outcome())

    def _served(self, eid: str) -> list[int]:
        """The weights versions that sampled the execution's tokens (its trace's segments)."""
        path = trace_path(self.rundir.traces, eid)
        try:
            recs = read_trace(path).records if path.exists() else []
        except (OSError, ValueError):  # unreadable: the trainer reports it, never fatal here
            return []
        return sorted({s.policy_version for r in recs for s in r.segments})

    async def run(self, gid: int, attempt: int, version: int | None = None) -> float | None:
        """Run one training execution to its assessment; its reward, or None when missing.

        The trainer keeps the ``Missing`` with its reason (``self.results``); the policy's
        event only needs to know the execution is invalid, so it gets ``None``. Its line in
        ``executions.jsonl`` (written as it finishes: what a resume restores it from) carries
        ``version``, the policy version it was dispatched at, and the versions that served it.
        """
        eid = f"r{self.segment}-g{gid:05d}-a{attempt:02d}"
        task = self.tasks.task(gid)
        self.running += 1
        try:
            env = self.longtail.env(gid, attempt) if self.longtail else None
            res = await self._run_one(eid, task, env)
        finally:
            self.running -= 1
        self.finished += 1
        h = res.harness
        failed = h.stop in ("launch_failed", "log_limit", "disk_limit") or (
            h.stop == "exited" and h.exit_code != 0
        )
        self.failed += int(failed)
        reward = reward_of(res.assessment)
        self.missing += int(isinstance(reward, Missing))
        if isinstance(reward, Missing):
            why = reward.reason.value
            self.missing_reasons[why] = self.missing_reasons.get(why, 0) + 1
        calls = h.model_calls
        self.results[(gid, attempt)] = (eid, reward)
        self.stops[(gid, attempt)] = h.stop
        served = await asyncio.to_thread(self._served, eid)
        self.rundir.log_execution(
            {
                "execution": eid,
                "group": gid,
                "attempt": attempt,
                "task": task.name,
                "segment": self.segment,
                "reward": res.reward,
                "missing": None if res.reward is not None else res.assessment.reason.value,
                "harness_stop": h.stop,
                "exit_code": h.exit_code,
                "failed": failed,
                "error": h.error[:300],
                "missing_detail": res.assessment.detail[:300]
                if isinstance(reward, Missing)
                else "",
                "model_calls": None
                if calls is None
                else {"attempted": calls.attempted, "answered": calls.answered},
                "seconds": round(res.timings.total_s, 3),
                "dispatch_version": version,
                "served_versions": served,
                "trace": str(trace_path(self.rundir.traces, eid).relative_to(self.rundir.path)),
            }
        )
        return res.reward

    def pack_group(
        self, gid: int, step: int, start_index: int, spans: dict[str, float] | None = None
    ) -> tuple[Any, int, dict[str, float], list]:
        """Traces + rewards of a finished group -> trees -> admissions -> micro-step tasks;
        ``spans`` gets the seconds each part took (``trees``, ``pack``)."""
        N = self.cfg.policy.group_size
        ids = {a: self.results.pop((gid, a)) for a in range(N)}
        stops = {a: self.stops.pop((gid, a), None) for a in range(N)}
        traces = {eid: trace_path(self.rundir.traces, eid) for eid, _ in ids.values()}
        rewards = {eid: r for eid, r in ids.values()}
        tcfg = self.cfg.trainer
        _, profile = self._started()
        t0 = time.perf_counter()
        group, report = group_from_traces(
            f"g{gid}",
            traces,
            rewards,
            role_profile=role_profile(profile.roles),
            j_max=tcfg.j_max,
            seed=tcfg.seed,
            step=step,
        )
        t1 = time.perf_counter()
        chunk = pack_groups([group], start_index, tcfg.stream, tcfg.objective)
        if spans is not None:
            spans.update(trees=t1 - t0, pack=time.perf_counter() - t1)
        scored = [r for r in rewards.values() if not isinstance(r, Missing)]
        st = chunk.stats
        info = {
            "reward_sum": sum(scored),
            "scored": len(scored),
            "missing": N - len(scored),
            "passed": sum(1 for r in scored if r >= 1.0),
            "unreadable_traces": len(report.unreadable),
            "tokens": st.tokens,
            "targets": st.targets,
            "micro_steps": st.micro_steps,
            "executions_trained": st.executions_trained,
            "groups_all_equal": st.groups_all_equal,
        }
        for r in rewards.values():  # by reason, per step (so per policy version): a trend shows
            if isinstance(r, Missing):
                info[f"missing/{r.reason.value}"] = info.get(f"missing/{r.reason.value}", 0) + 1
        info.update(self._health(traces, report.health, profile))
        info.update(timeout_sums((stops[a], not isinstance(ids[a][1], Missing)) for a in range(N)))
        info.update(tree_sums(group.admissions.values()))
        return group, st.executions_scored, info, chunk.tasks

    @staticmethod
    def _health(
        traces: dict[str, Path], read: dict[str, ToolHealth], profile: HarnessProfile
    ) -> dict[str, int]:
        """The group's tool-call health sums (``gyre.trace.toolhealth``), keyed by profile,
        and its histogram of turns per execution (``gyre.trace.agentstats``).

        Scored executions were counted while their traces were read; a missing one's trace
        (a harness that ended after one answer is often missing) is read here."""
        roles = role_profile(profile.roles)
        total = ToolHealth()
        turns: list[int] = []
        for eid, path in traces.items():
            h = read.get(eid)
            if h is None:
                try:
                    recs = read_trace(path).records if path.exists() else []
                except (OSError, ValueError):  # unreadable: counted as no call, never fatal
                    recs = []
                h = execution_health(recs, roles)
            total = total + h
            turns.append(h.turns)
        return {**total.sums(profile.name), **turn_sums(turns)}

    # ------------------------------------------------------------------ evaluation
    def maybe_evaluate(self, version: int) -> None:
        """At a publication that crossed a multiple of eval_interval: evaluate the newly served policy."""
        every = self.cfg.run.eval_interval
        if not every or version // every <= self._last_eval // every:
            return
        self.start_eval(version)

    def start_eval(self, version: int) -> None:
        if version == self._last_eval:
            return
        self._last_eval = version
        t = asyncio.get_running_loop().create_task(self.evaluate(version))
        self.eval_tasks.add(t)
        t.add_done_callback(self.eval_tasks.discard)

    async def wait_evals(self) -> None:
        """Evaluations still running; a failed one is reported, never fatal to the run."""
        for r in await asyncio.gather(*self.eval_tasks, return_exceptions=True):
            if isinstance(r, BaseException):
                self.rundir.write_eval(
                    {"version": self._last_eval, "error": f"{type(r).__name__}: {r}"}
                )

    async def evaluate(self, version: int) -> dict[str, Any]:
        """Fresh attempts on the evaluation split (recorded apart from training rewards)."""
        jobs = [(t, a) for t in self.tasks.eval for a in range(self.cfg.run.eval_attempts)]

        async def one(eid: str, task: Any) -> Any:
            try:
                return await self._run_one(eid, task)
            finally:
                self.eval_live -= 1
                self.on_eval_live(self.eval_live)

        self.eval_live += len(jobs)
        self.on_eval_live(self.eval_live)
        res = await asyncio.gather(
            *[one(f"r{self.segment}-eval-v{version}-{t.name}-a{a}", t) for t, a in jobs]
        )
        scored = [r.reward for r in res if r.reward is not None]
        row = {
            "version": version,
            "executions": len(res),
            "scored": len(scored),
            "reward_mean": sum(scored) / len(scored) if scored else None,
            "pass_rate": sum(1 for r in scored if r >= 1.0) / len(scored) if scored else None,
            "held_out": self.tasks.held_out,
            "per_task": {
                t.name: json.loads(
                    json.dumps([r.reward for (tt, _), r in zip(jobs, res) if tt.name == t.name])
                )
                for t in self.tasks.eval
            },
        }
        self.rundir.write_eval(row)
        return row
