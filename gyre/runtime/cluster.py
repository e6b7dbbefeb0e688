"""The cells on Ray and the proxy in front of their engines: the mechanics of moving a cell.

Into training: the proxy stops routing to the cell's engine and moves its in-flight
calls elsewhere with the tokens so far (the waterlevel rule guarantees room), the
engine is dropped, the replica loads the core's current weights. Back to rollout:
the replica is dropped (the core keeps its optimizer state in host memory), an
engine starts on the newest published weights and joins the proxy's pool.
Publication (:class:`gyre.runtime.publication.Publications`, which owns the published
weights): the core writes a Hugging Face directory; every rollout engine pauses, reloads it
from disk with the new version number, and continues. Connecting to Ray and the cells'
resources: :mod:`gyre.runtime.ray_setup`.

Who can reach an engine: a local run binds every server of its cells to 127.0.0.1
(``GYRE_BIND_HOST``, see :mod:`gyre.runtime.nodeaddr`); on any run, every route of every
engine but ``/health`` wants the run's engine key, a secret made here per run and given only
to the cells and standalone engines (an actor argument) and to the proxy (this process's
memory), never to the driver's environment that harness processes start from, nor to Ray's
``runtime_env`` (logged world-readable); and an engine reloads weights only from the run's
``weights/`` folder.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import TYPE_CHECKING, Any

import ray

from gyre.engine.client import EngineClient
from gyre.log import LogSpec, current
from gyre.policy import CellRole
from gyre.proxy.config import ProxyConfig
from gyre.proxy.heartbeat import EngineEvent
from gyre.proxy.service import load_tokenizer
from gyre.runtime import ranks
from gyre.runtime.cell import Cell
from gyre.runtime.config import GyreConfig
from gyre.runtime.cpulimit import CpuLimitError, find_controller, sweep
from gyre.runtime.engines import engine_start_error
from gyre.runtime.managed_proxy import ManagedProxy
from gyre.runtime.publication import Publications
from gyre.runtime.ray_setup import (
    RuntimeSetupError,
    actor_died,
    cell_resources,
    check_resources,
    engine_env,
    init_ray,
)
from gyre.runtime.rendezvous import Rendezvous
from gyre.runtime.rundir import RunDir
from gyre.runtime.standalone import start_one
from gyre.train.stats import ObjectiveStats

if TYPE_CHECKING:
    from gyre.train.tasks import MicroStepTask

log = logging.getLogger("gyre.runtime.cluster")


# what a cell's or engine's stop gets at the run's end before its actor is killed: an embedded
# engine and a gloo world stop in well under a second; a vLLM server is given longer
SETTLE_S = {"embedded": 10.0, "vllm": 30.0}


async def _settle(refs: list, what: str, timeout_s: float) -> None:
    """Wait for actor calls made at shutdown, whatever they raise, but not forever: the actors
    are killed next either way (Ray kills an actor's child processes with it, a vLLM server
    included), and a hung one must not hold the run's exit. One that did not answer in time
    is named in the log: a stop that hangs is a bug to find, not to wait out."""
    tasks = [asyncio.ensure_future(r) for r in refs]
    done, pending = await asyncio.wait(tasks, timeout=timeout_s) if tasks else (set(), set())
    for t in done:  # read each outcome: nothing is re-raised at exit
        if not t.cancelled():
            t.exception()
    if pending:
        late = [i for i, t in enumerate(tasks) if t in pending]
        log.warning("%s %s did not stop within %g s: killed", what, late, timeout_s)
        for t in pending:
            t.cancel()


def _sweep_cgroups() -> None:
    """Remove the cell cgroups whose processes have exited (killed actors take a moment)."""
    try:
        c = find_controller()
    except CpuLimitError:
        return
    for _ in range(20):
        sweep(c)
        if not any(c.parent().glob("cell-*")):
            return
        time.sleep(0.1)


class _Phases:
    """Seconds since the previous lap, under a name: where a run's start-up went (a user
    waiting for the first step, and the suite that starts ~30 runs, both want to know)."""

    def __init__(self, into: dict[str, float]):
        self.into, self.t = into, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.into[name] = round(now - self.t, 3)
        self.t = now


class Cluster:
    def __init__(
        self,
        cfg: GyreConfig,
        rundir: RunDir,
        *,
        resume_from: str | None = None,
        base_version: int = 0,
    ):
        self.cfg, self.rundir = cfg, rundir
        self.K = cfg.policy.cells
        if resume_from and (why := ranks.resume_mismatch(resume_from, cfg.run.cell.devices)):
            raise RuntimeSetupError(why)
        self.resume_from = resume_from
        self.cells: list[Any] = []
        self.urls: list[str | None] = [None] * self.K
        self.switch_kv: dict[int, dict[str, Any]] = {}  # cell -> its last drain's K/V moves
        self.engine_urls: list[list[str]] = [[] for _ in range(self.K)]  # every one, per cell
        self.proxy = ManagedProxy()  # started last by start(), stopped first by stop()
        self.engine_key = secrets.token_urlsafe(32)  # this run's engines answer only to it
        self.publications = Publications(
            rundir.weights,
            resume_from or cfg.model_dir,
            base_version,
            self.engine_key,
            keep=cfg.run.keep_published,
            in_memory=cfg.run.publication == "distributed",
        )
        self.trainer_version = base_version
        self.placement: list[dict[str, Any]] = []
        self.standalone: list[
            tuple[Any, str]
        ] = []  # (Ray actor, URL) of the standalone rollout pool
        self.dead_engines: list[str] = []
        self.engine_events: list[EngineEvent] = []  # the proxy heartbeat's lost / back engines
        self.rendezvous = Rendezvous()  # the gloo worlds' store files (one machine)
        self.startup: dict[str, float] = {}  # seconds per start-up phase (summary.json)
        self._asks: list[dict[str, float]] = []
        self._runtime_env: dict[str, Any] = {}
        # called with (cell, cause, where) when a cell's engine is found dead (the world's)
        self.on_cell_lost: Any = None
        # called with (url, cause) when a standalone engine left the pool (the world's)
        self.on_engine_lost: Any = None

    @property
    def weights_dir(self) -> str:
        """The newest published weights (HF layout)."""
        return self.publications.dir

    @property
    def published_version(self) -> int:
        """The policy version the engines serve (the trainer's, ``trainer_version``, runs
        ahead of it within a burst)."""
        return self.publications.version

    @property
    def weights_sums(self) -> dict[str, float] | None:
        """The core's fingerprints of ``weights_dir`` (None before the first publication)."""
        return self.publications.sums

    # ------------------------------------------------------------------ lifecycle
    async def start(self, roles: list[CellRole]) -> None:
        """Cells up (Ray actors, their gloo world), each in its initial role, the standalone
        engines, then the proxy in front of every engine."""
        clock = _Phases(self.startup)
        # the proxy's tokenizer loads in a thread while Ray, the cells and their engines come up
        tokenizer = asyncio.get_running_loop().run_in_executor(
            None, load_tokenizer, self.cfg.proxy.model_dir
        )
        # its outcome is read here too: a cell that fails to start leaves it unawaited
        tokenizer.add_done_callback(lambda f: f.cancelled() or f.exception())
        init_ray(self.cfg)
        clock.lap("ray_s")
        res = self.cfg.run.cell
        asks = [cell_resources(self.cfg, i) for i in range(self.K)]
        standalone = self.cfg.run.standalone_engines if self.cfg.policy.standalone_capacity else 0
        check_resources(asks + [res.resources] * standalone, ray.cluster_resources())
        runtime_env = self._runtime_env = {"env_vars": engine_env(self.cfg, self.rundir)}
        await self._start_cells(asks, runtime_env)
        clock.lap("cells_s")
        await self._take_roles(roles)
        clock.lap("engines_s")
        if self.cfg.policy.standalone_capacity > 0:  # C_s: engines that never train
            await self._start_standalone()
            clock.lap("standalone_s")
        self.rundir.write_cells(self.placement)
        await self._start_proxy(await tokenizer)
        clock.lap("proxy_s")

    async def _start_standalone(self) -> None:
        """Every engine of the standalone pool; one that fails stops everything with one line."""
        for j in range(self.cfg.run.standalone_engines):
            try:
                a, url = await self._standalone_engine(j)
            # broad on purpose: an engine fails to start in many ways (its server's exit, a
            # RayTaskError around anything, a timeout), each one line for the user
            except Exception as e:
                await self.stop()
                why = engine_start_error(e)
                raise RuntimeSetupError(f"standalone engine {j} did not start: {why}") from None
            self.standalone.append((a, url))
            row = {"standalone": j, "pid": await a.pid.remote(), "node": await a.node.remote()}
            self.placement.append({**row, "url": url})

    async def _standalone_engine(self, j: int, restart: int = 0) -> tuple[Any, str]:
        name = f"standalone-{j}"
        return await start_one(
            self.cfg, self.publications, j, self._runtime_env, self.log_spec(name), restart
        )

    def standalone_of(self, url: str) -> int | None:
        """Which standalone engine serves at ``url`` (None: none of them)."""
        rows = self.placement
        return next((r["standalone"] for r in rows if "standalone" in r and r["url"] == url), None)

    async def replace_standalone(self, j: int, restart: int) -> None:
        """A new actor for standalone engine ``j`` (its ``restart``-th), on the newest weights,
        in the proxy's pool; ``cells.json`` names the new process."""
        old = next((r for r in self.placement if r.get("standalone") == j), None)
        a, url = await self._standalone_engine(j, restart)
        await self.proxy.add_engine(url)
        self.standalone.append((a, url))
        if old is not None:
            old.update(pid=await a.pid.remote(), url=url, restarts=restart)
            self.rundir.write_cells(self.placement)

    async def take_out(self, cell: int, why: str) -> dict[str, Any]:
        """Cell ``cell`` is lost: its actor is killed (a hung process holds its engine's sockets
        open; a killed one breaks them) and its engine leaves the proxy's pool through the
        pool's own drain, every call it held resuming on another engine. Returns what that
        cost: ``moved_calls``, ``engine_removed_s`` (nothing when it served no engine)."""
        try:
            ray.kill(self.cells[cell], no_restart=True)
        except ray.exceptions.RayError:  # already gone (a handle of an ended session)
            pass
        url, self.urls[cell] = self.urls[cell], None
        if url is None or not self.proxy.started:
            return {}
        t0 = time.perf_counter()
        moved0 = self.proxy.moved()
        try:
            await self.proxy.remove_engine(url, 30, why)
        except (KeyError, TimeoutError, RuntimeError):  # removed already, drain cut, proxy down
            pass
        return {
            "moved_calls": self.proxy.moved() - moved0,
            "engine_removed_s": round(time.perf_counter() - t0, 3),
        }

    async def replace_cell(self, cell: int, resume_from: str | None, restarts: int) -> None:
        """A new actor for lost cell ``cell`` (its ``restarts``-th); every cell rebuilds the
        gloo world with it (the prefix communicators of the new membership), and ``cells.json``
        names the new process (no engine yet: the policy sends it to rollout). A new core's
        first switch into training loads ``resume_from`` (None: the segment's initial weights)."""
        if cell == 0:
            self.resume_from = resume_from
        self.cells[cell] = self.cell_actor(cell)
        await self.build_world()  # the survivors and the new actor: the new membership's world
        pid = await self.cells[cell].pid.remote()
        if cell < len(self.placement):
            self.placement[cell] = {**self.placement[cell], "pid": pid, "restarts": restarts}
            self.placement[cell].pop("url", None)
            self.rundir.write_cells(self.placement)

    async def _start_cells(self, asks: list[dict[str, float]], runtime_env: dict) -> None:
        """One actor per cell; the gloo world is served by the core, on its node's IP and
        ports free there. Fills ``placement`` (pid, node, cgroup of each cell)."""
        self._asks, self._runtime_env = asks, runtime_env  # a restarted cell asks the same
        self.cells = [self.cell_actor(i) for i in range(self.K)]
        gloo = await self.build_world()
        res = self.cfg.run.cell
        ips = await asyncio.gather(*[c.node_ip.remote() for c in self.cells])
        pids = await asyncio.gather(*[c.pid.remote() for c in self.cells])
        nodes = await asyncio.gather(*[c.node.remote() for c in self.cells])
        groups = await asyncio.gather(*[c.group.remote() for c in self.cells])
        every = await asyncio.gather(*[ranks.pids(c) for c in self.cells])
        self.placement = [
            {"cell": i, "pid": p, "node": n, "node_ip": ip, "resources": asks[i], "gloo": gloo}
            | ({"cgroup": g, "cpu_quota": res.cpu_quota} if g else {})
            | ({"rank_pids": every[i]} if res.devices > 1 else {})
            for i, (p, n, ip, g) in enumerate(zip(pids, nodes, ips, groups))
        ]

    def cell_actor(self, i: int) -> Any:
        """A new handle for cell ``i`` (at start, and when a lost cell is restarted): one actor,
        or with ``run.cell.devices`` > 1 its G rank actors as one (:mod:`gyre.runtime.ranks`).
        Its ``ping`` runs in a concurrency group of its own, so a cell busy training answers."""
        res = self.cfg.run.cell
        tcfg, ecfg = self.cfg.trainer, self.cfg.engine  # pydantic models cross into the actors
        remote: Any = ray.remote  # Ray's stubs lack the class form's concurrency_groups

        def make(local: int, node: str | None) -> Any:
            name = f"cell-{i}" if local == 0 else f"cell-{i}-rank{local}"
            return (
                remote(concurrency_groups={"health": 1})(Cell)
                .options(
                    num_cpus=res.num_cpus,
                    num_gpus=res.num_gpus,
                    resources=(self._asks[i] or None) if local == 0 else None,
                    max_concurrency=1,
                    runtime_env=self._runtime_env,
                    **ranks.rank_options(node),
                )
                .remote(
                    i,
                    self.K,
                    tcfg,
                    ecfg,
                    res.torch_threads,
                    res.cpu_quota,
                    self.engine_key,
                    self.log_spec(name),
                    local,
                    res.devices,
                )
            )

        return ranks.new_cell(make, res.devices)

    async def close_engine_phases(self) -> None:
        """Every cell still serving logs its engine's counts (``Cell.log_engine_phase``); one
        that cannot (gone at the run's end) only leaves its phase out of the run's figures."""
        serving = [self.cells[i] for i, url in enumerate(self.urls) if url is not None]
        await asyncio.gather(
            *[c.log_engine_phase.remote() for c in serving], return_exceptions=True
        )

    async def build_world(self) -> str:
        """Every cell (re)joins a fresh gloo world and builds its prefix communicators
        (collective). Its rendezvous is a fresh file in the driver's private folder when every
        cell is on the driver's machine, else a TCPStore the core serves at its node IP on a
        port free there (:mod:`gyre.runtime.rendezvous`). Each actor runs it after
        the calls it already has (one at a time, in the driver's order), so a survivor's work in
        flight finishes first. Returns the world's address."""
        ips = await asyncio.gather(*[c.node_ip.remote() for c in self.cells])
        store = await self.rendezvous.store_file(self.cells)  # one machine: a private file
        (dist_port,) = [0] if store else await self.cells[0].free_ports.remote(1)
        # every cell's answer before any error is raised: a cell that died on the way leaves
        # the others waiting in this rendezvous until its timeout, and the next rebuild must
        # not start while they are (they would queue its setup behind this one's)
        done = await asyncio.gather(
            *[c.setup.remote(dist_port, ips[0], store) for c in self.cells],
            return_exceptions=True,
        )
        errors = [x for x in done if isinstance(x, BaseException)]
        if errors:
            raise next((x for x in errors if actor_died(x)), errors[0])
        return f"{ips[0]}:{dist_port}"  # port 0: no TCP rendezvous (a FileStore)

    def log_spec(self, name: str) -> LogSpec:
        """How actor ``name`` logs: stderr (Ray's worker log) as the driver's, and JSON lines to
        the run's ``logs/<name>.jsonl`` at ``run.log_level``."""
        level, fmt = current()
        return LogSpec(level, fmt, str(self.rundir.logs / f"{name}.jsonl"), self.cfg.run.log_level)

    async def _take_roles(self, roles: list[CellRole]) -> None:
        """Initial roles: training cells load replicas (core first), rollout cells start
        engines (a failed start stops everything: one clear line, no process left)."""
        for i in [i for i in range(self.K) if roles[i] is CellRole.TRAINING]:
            await self.cells[i].load_replica.remote(
                self.trainer_version, self.rundir.snapshots, self.resume_from
            )
        try:
            urls = await asyncio.gather(
                *[
                    self.cells[i].start_engine.remote(self.weights_dir, self.published_version)
                    for i in range(self.K)
                    if roles[i] is CellRole.ROLLOUT
                ]
            )
        # broad on purpose, as for a standalone engine: e.g. a vLLM server that exits at start
        # (its log's last words); every engine start failure is one line, nothing left running
        except Exception as e:
            await self.stop()  # vLLM servers are processes of their own: none is left behind
            raise RuntimeSetupError(
                f"a cell's engine did not start: {engine_start_error(e)}"
            ) from None
        it = iter(urls)
        for i in range(self.K):
            if roles[i] is CellRole.ROLLOUT:
                self._serving(i, next(it))
                self.placement[i]["url"] = self.urls[i]

    async def _start_proxy(self, tokenizer: Any) -> None:
        """The managed proxy in front of every engine, with this run's engine key and the
        served model's ``tokenizer``."""
        engines = [u for u in self.urls if u] + [u for _, u in self.standalone]
        pcfg = ProxyConfig.model_validate(
            {
                **self.cfg.proxy.model_dump(),
                "engines": engines,
                "mode": "managed",
                "trace_dir": str(self.rundir.traces),
            }
        )
        loop = asyncio.get_running_loop()  # the heartbeat calls on the proxy's thread: hand over
        await self.proxy.start(
            pcfg,
            self.engine_key,
            lambda ev: loop.call_soon_threadsafe(self._on_engine_event, ev),
            tokenizer,
        )

    def _on_engine_event(self, ev: EngineEvent) -> None:
        """A standalone engine the proxy's heartbeat lost leaves the pool now (not at the next
        publication) and counts as dead; its calls already moved. A cell's engine is the
        policy's business (it stays in the pool, out of routing, until it answers again)."""
        self.engine_events.append(ev)
        if ev.kind == "lost" and ev.url in [u for _, u in self.standalone]:
            asyncio.get_running_loop().create_task(
                self._engine_lost(ev.url, RuntimeError(f"heartbeat: {ev.why}"))
            )

    async def stop(self) -> None:
        settle = SETTLE_S[self.cfg.engine.kind]
        await self.proxy.stop()
        if self.cells:
            await _settle([c.teardown.remote() for c in self.cells], "cells", settle)
            for c in self.cells:
                ranks.kill(c)
            self.cells = []
            if self.cfg.run.cell.cpu_quota is not None:  # this node's emptied cell groups
                await asyncio.to_thread(_sweep_cgroups)
        self.rendezvous.close()
        if self.standalone:  # stop first: a vLLM server is a process of its own, not the actor's
            await _settle([a.stop.remote() for a, _ in self.standalone], "standalone", settle)
        for a, _ in self.standalone:
            ray.kill(a)
        self.standalone = []

    # ------------------------------------------------------------------ switching
    async def to_training(self, cell: int) -> int:
        """Drain the cell's engine through the proxy, drop it, load a replica. Returns calls moved."""
        moved = 0
        url = self.urls[cell]
        if url is not None:
            await self.proxy.serving("switch")  # a switch must not fail on a dead proxy
            try:
                moved = await self.proxy.drain(url)
                # what the drain's K/V migration moved and saved, for the switch's record
                self.switch_kv[cell] = self.proxy.last_drain(url)
                await self.proxy.remove_engine(url)
            except KeyError:  # the cell was found lost meanwhile: its fault handler removed it
                pass  # (the calls below then fail as the dead actor's, or it is killed)
            self.urls[cell] = None
            await self.cells[cell].park_engine.remote()  # vLLM: paused and kept, not stopped
        await self.cells[cell].load_replica.remote(
            self.trainer_version, self.rundir.snapshots, self.resume_from
        )
        return moved

    async def to_rollout(self, cell: int) -> None:
        """Drop the replica, start an engine on the newest published weights (a kept vLLM one
        reloads them and resumes), add it to the pool."""
        pubs = self.publications
        await pubs.settled()  # a returning satellite serves the version being published
        await self.cells[cell].drop_replica.remote()
        url = await pubs.start_on_newest(self.cells[cell].start_engine.remote)
        if pubs.sums is not None:  # it serves a publication: check it like the others
            async with EngineClient(url, api_key=self.engine_key) as c:
                info = await c.model_info()
            pubs.check(f"cell {cell}'s engine ({url})", info)
        await self.proxy.serving("switch")
        await self.proxy.add_engine(url)
        self._serving(cell, url)

    def _serving(self, cell: int, url: str) -> None:
        """Cell ``cell``'s engine serves at ``url``; every URL a cell served at is kept
        (``engine_urls`` in the summary: which address the proxy reached each cell at)."""
        self.urls[cell] = url
        if url not in self.engine_urls[cell]:
            self.engine_urls[cell].append(url)

    # ------------------------------------------------------------------ training
    def put_tasks(self, tasks: list[MicroStepTask]) -> list[ray.ObjectRef]:
        """A group's micro-step tasks, put in the object store once: every claim of the group
        sends this reference (wrapped in a list, so Ray leaves fetching to the cell, which does
        it once per group), not the tasks."""
        return [ray.put(tasks)]

    async def compute(
        self,
        cell: int,
        step: int,
        version: int,
        group: int,
        tasks: list[ray.ObjectRef],
        shard: list[int],
    ) -> ObjectiveStats:
        return await self.cells[cell].compute.remote(
            step, version, group, tasks, shard, self.rundir.snapshots
        )

    async def finish_step(
        self, k: int, stats: dict[int, ObjectiveStats], n_scored: int, groups: list[str]
    ) -> dict:
        """The step's reduce over cells 0..k-1 and the core's optimizer step; the core
        checkpoints into the run directory when ``trainer.checkpoint`` says it is due."""
        zero = ObjectiveStats()
        sats = [self.cells[c].reduce.remote(k, stats.get(c, zero)) for c in range(1, k)]
        core = self.cells[0].finish_step.remote(
            k,
            stats.get(0, zero),
            n_scored,
            groups,
            self.rundir.snapshots,
            str(self.rundir.checkpoints),
            self.cfg.policy.total_steps,
        )
        metrics, *_ = await asyncio.gather(core, *sats)
        self.trainer_version += 1
        return metrics

    async def publish(self, version: int, rollout_cells: list[int]) -> dict[str, Any]:
        """The core writes version ``version``; every rollout engine pauses, reloads it,
        continues (:meth:`Publications.publish`); an engine that could not is lost."""
        urls = [u for u in (self.urls[c] for c in rollout_cells) if u]
        urls += [u for _, u in self.standalone]
        core = self.cells[0]
        info, failed = await self.publications.publish(
            version, urls, core.save_hf.remote, core.publish_in_memory.remote, self._engine_name
        )
        for url, why in failed:
            await self._engine_lost(url, why)
        return info

    def _engine_name(self, url: str) -> str:
        cells = [c for c, u in enumerate(self.urls) if u == url]
        return f"cell {cells[0]}'s engine ({url})" if cells else f"standalone engine {url}"

    async def _engine_lost(self, url: str, why: BaseException) -> None:
        """An engine that cannot reload is gone (its process died): take it out of the pool so no
        call is routed there again. Calls it held were already resumed elsewhere by the pool.
        A cell's engine is the cell's fault handler's (``on_cell_lost``) when one is set."""
        cells = [c for c, u in enumerate(self.urls) if u == url]
        if cells and self.on_cell_lost is not None:
            self.on_cell_lost(cells[0], why, "publication")
            return
        if url in self.dead_engines:  # the heartbeat took it out already
            return
        if any(url in us for us in self.engine_urls):
            # a cell's engine that no longer serves as one: the cell was lost (its fault
            # handler took the engine out and restarts it) or left rollout meanwhile
            return
        if url not in [u for _, u in self.standalone]:
            raise RuntimeError(f"rollout engine {url} failed to reload weights: {why}") from why
        for a, _ in [x for x in self.standalone if x[1] == url]:
            try:  # a hung process holds its sockets: killed, as a lost cell's is
                ray.kill(a, no_restart=True)
            except ray.exceptions.RayError:  # already gone
                pass
        self.standalone = [(a, u) for a, u in self.standalone if u != url]
        self.dead_engines.append(url)
        try:
            await self.proxy.remove_engine(url, 30)
        except (KeyError, TimeoutError, RuntimeError):  # removed already, drain cut, proxy down
            pass
        if self.on_engine_lost is not None:
            self.on_engine_lost(url, why)
