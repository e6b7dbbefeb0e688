"""One cell: a long-lived process that holds an engine (rollout) or a training replica (training).

The controller wraps :class:`Cell` with ``ray.remote`` and moves it between roles in
place, as the paper does: the process, its torch.distributed world and the prefix
communicators stay alive across switches; only the engine or the replica is built
and dropped. This module is that role plumbing only: start, park and stop the engine,
load and drop the replica. The training state (replica, the core's optimizer, trainer
state, policy version, the step's tasks) is one :class:`gyre.train.trainer.CellTrainer`.

Nothing here schedules: every method is one step of an action the policy chose.

Each cell logs what it does as structured records (``gyre.log``) to the run's
``logs/cell-<i>.jsonl``: its role switches (``event: "switch"``, the cell's own part: engine
parked or dropped plus replica loaded, or replica dropped plus engine up) and its training work
(``microstep.claimed`` / ``microstep.done``, and on the core ``optimizer_step``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from gyre.engine.checksum import fingerprints
from gyre.engine.client import EngineClient, use_api_key
from gyre.engine.service import EngineService
from gyre.log import LogSpec
from gyre.ports import free_ports
from gyre.runtime.cpulimit import confine
from gyre.runtime.engines import RolloutEngineConfig, cell_engine_config, keeps_engine
from gyre.runtime.heap import release
from gyre.runtime.nodeaddr import gloo_env, ipv4_interfaces, node_ip
from gyre.runtime.publication import MemoryPublisher
from gyre.runtime.ranks import leave_world, sharded_setup
from gyre.runtime.seeds import SEED_STRIDE
from gyre.train.cell import TrainCell
from gyre.train.config import TrainerConfig
from gyre.train.stats import ObjectiveStats

if TYPE_CHECKING:
    from gyre.train.tasks import MicroStepTask

log = logging.getLogger("gyre.runtime.cell")


class Cell:
    def __init__(
        self,
        index: int,
        world: int,
        trainer_cfg: TrainerConfig,
        engine_cfg: RolloutEngineConfig,
        torch_threads: int = 1,
        cpu_quota: float | None = None,
        engine_key: str | None = None,
        log_spec: LogSpec | None = None,
        local: int = 0,
        devices: int = 1,
    ):
        (log_spec or LogSpec()).apply()  # an actor's process starts with no logging of Gyre's
        use_api_key(engine_key)  # the run's engine key: its engines want it, its clients send it
        self.cgroup: str | None = None  # the cell's own cgroup under run.cell.cpu_quota
        if cpu_quota is not None:  # before any thread starts: all of them land in the group
            self.cgroup = str(confine(os.getpid(), cpu_quota))
        os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))
        # torch loads here, in the actor, after the cgroup and OMP_NUM_THREADS: the driver imports
        # this module to wrap it with ray.remote and never loads torch
        import torch

        from gyre.train.trainer import CellTrainer

        torch.set_num_threads(torch_threads)
        self.index, self.world = index, world
        self.local, self.devices = local, devices  # rank in the cell; G (run.cell.devices)
        self.ecfg, self.torch_threads = engine_cfg, torch_threads
        self.tcfg = trainer_cfg
        # G > 1: a ShardedCellTrainer, built by setup() over the cell's process groups
        self.trainer: Any = CellTrainer(index, trainer_cfg) if devices == 1 else None
        self.cell: TrainCell | None = None  # process group + prefix communicators
        self.engine: EngineService | None = None  # while in rollout (a vLLM one: for life)
        self.parked = False  # the engine is kept, paused, while the cell trains (vLLM)
        self.role: str | None = None  # "rollout" or "training" once it took one
        self._leaving: float | None = None  # when this cell began to leave its role
        # heap.release() of the last role left, and its engine's counts (_served)
        self._released: dict[str, Any] = {}

    def _comm(self):
        if self.devices > 1:  # the sharded trainer holds its own groups
            return None
        if self.cell is None:
            raise RuntimeError(f"cell {self.index} is not set up (call setup() first)")
        return self.cell.comm

    # ---------------------------------------------------------------- plumbing (once)
    @ray.method(concurrency_group="health")
    def ping(self) -> int:
        """The driver's heartbeat (a group of its own: answered while the cell trains)."""
        return os.getpid()

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def group(self) -> str | None:
        """The cgroup holding this cell to its CPU quota (None: no quota)."""
        return self.cgroup

    def node_ip(self) -> str:
        """The IP of the node this cell runs on (nodes on one machine share it; the id tells
        apart). Its engines bind it; the core's also hosts the cells' gloo world."""
        return node_ip()

    def free_ports(self, n: int) -> list[int]:
        """``n`` ports free on this cell's node (the core's: where the gloo world listens)."""
        return free_ports(n, node_ip())

    def sees(self, folder: str, token: str) -> bool:
        """Whether this cell reads ``folder/token`` as ``token``: the driver's private folder is
        on this cell's machine, so the gloo world's rendezvous can be a file there."""
        try:
            return (Path(folder) / "token").read_text() == token
        except OSError:
            return False

    def setup(self, dist_port: int, host: str = "127.0.0.1", store_file: str | None = None) -> None:
        """Join the cells' gloo world and build every prefix communicator (collective: all
        cells at once). Its rendezvous is a FileStore at ``store_file`` when every cell is on
        the driver's machine, else a TCPStore the core serves at ``host:dist_port`` (its node
        IP). On a non-loopback node the cell's own gloo sockets bind the interface holding its
        node IP (see nodeaddr)."""
        os.environ.update(gloo_env(node_ip(), dict(os.environ), ipv4_interfaces()))
        if self.devices > 1:  # K cells x G ranks, fsdp.py's groups (gyre.runtime.ranks)
            self.trainer = sharded_setup(self, dist_port, host, store_file)
            return
        if self.cell is not None:  # a rebuild (a cell was restarted): leave the old world
            self.cell.teardown()
        cell = self.cell = TrainCell(
            self.index,
            self.world,
            dist_port=dist_port,
            store_port=None,  # micro-steps go through Ray: no coordination store
            host=host,
            store_file=store_file,
        )
        cell.setup()

    def teardown(self) -> None:
        self.stop_engine()
        if self.devices > 1:
            leave_world()
        if self.cell is not None:
            self.cell.teardown()
            self.cell = None

    # ---------------------------------------------------------------- rollout role
    def start_engine(self, weights_dir: str, version: int) -> str:
        """Serve ``weights_dir`` (policy ``version``); returns the engine's URL. A kept (parked)
        engine reloads those weights in place and resumes; otherwise a fresh one starts."""
        t0 = time.perf_counter()
        if self.engine is not None and self.parked and self.engine.url is not None:
            asyncio.run(_wake(self.engine.url, weights_dir, version))
            self.parked = False
            self._arrived("rollout", version, t0)
            return self.engine.url
        cfg = cell_engine_config(
            self.ecfg,
            model_dir=weights_dir,
            engine_id=f"cell-{self.index}",
            version=version,
            seed=self.ecfg.seed * SEED_STRIDE + self.index * 7919 + version,
            torch_threads=self.torch_threads,
        )
        svc = EngineService(cfg, host=node_ip())  # reachable from the driver's node
        url = svc.start(timeout=_start_timeout(self.ecfg))
        self.engine = svc
        self.parked = False
        self._arrived("rollout", version, t0)
        return url

    def park_engine(self) -> None:
        """Leave rollout (the proxy has drained the engine). The embedded engine is dropped, its
        weights and K/V with it; a vLLM server (30-90 s to start) is paused and kept."""
        self._leave()
        if self.engine is None or self.engine.url is None or not keeps_engine(self.ecfg):
            did = _served(self.engine)
            self.stop_engine()
            self._released = release() | did  # its pages back to the machine (gyre.runtime.heap)
            return
        asyncio.run(_pause(self.engine.url))
        self.parked = True

    def log_engine_phase(self) -> None:
        """The run ends with this cell serving: log what its engine did in that last phase (the
        switch records hold only phases that ended in a switch, and an Async run's rollout
        cells never switch)."""
        did = _served(self.engine)
        if did and not self.local:
            log.info(
                "cell %d: engine phase closed by the run's end",
                self.index,
                extra={"event": "engine_phase", "cell": self.index, **did},
            )

    def stop_engine(self) -> None:
        """Drop the engine: its weights and K/V go with it (a vLLM server is stopped)."""
        if self.engine is not None:
            self.engine.stop()
            self.engine = None
        self.parked = False

    # ---------------------------------------------------------------- training role
    def load_replica(
        self, version: int, snapshot_dir: str, resume_from: str | None = None
    ) -> float:
        """Become a training replica at ``version``; returns the seconds it took."""
        t0 = time.perf_counter()
        self.trainer.load(version, snapshot_dir, resume_from)
        self._arrived("training", version, t0)
        return time.perf_counter() - t0

    def drop_replica(self) -> None:
        """Satellites drop their replica; the core keeps weights and optimizer state (host memory)."""
        self._leave()
        self.trainer.drop()
        self._released = release()  # activations, gradients (a satellite's replica too)

    def _leave(self) -> None:
        """A switch out of the cell's role begins (the drain before it is the driver's)."""
        if self._leaving is None:
            self._leaving = time.perf_counter()

    def _arrived(self, role: str, version: int, t0: float) -> None:
        """The cell holds ``role`` at ``version``: one ``switch`` record, timed from when it began
        to leave its last role (from ``t0`` for its first one)."""
        seconds = time.perf_counter() - (self._leaving if self._leaving is not None else t0)
        released, self._released = self._released, {}
        if self.local:  # a multi-rank cell's switch is its leader's record
            self.role, self._leaving = role, None
            return
        log.info(
            "cell %d: %s -> %s in %.2f s (v%d)",
            self.index,
            self.role or "start",
            role,
            seconds,
            version,
            extra={
                "event": "switch",
                "cell": self.index,
                "from": self.role,
                "to": role,
                "seconds": round(seconds, 4),
                "version": version,
                **released,  # what leaving the last role gave back (gyre.runtime.heap)
            },
        )
        self.role, self._leaving = role, None

    def compute(
        self,
        step: int,
        version: int,
        group: int,
        tasks: list[ray.ObjectRef],
        indices: list[int],
        snapshot_dir: str,
    ) -> ObjectiveStats:
        """Forward/backward of some of a group's micro-steps; gradients accumulate. ``tasks``
        wraps the group's tasks in the object store (put once per group by the driver; wrapped
        in a list so Ray does not fetch them for every call): fetched on this cell's first
        micro-step of the group. Returns the summed stats."""

        def fetch() -> Sequence[MicroStepTask]:
            return ray.get(tasks[0])

        where = {"cell": self.index, "step": step, "version": version, "group": group}
        if self.devices > 1:
            where["rank"] = self.local
        n = len(indices)
        log.info(
            "cell %d: claimed %d micro-steps of g%d (step %d)",
            self.index,
            n,
            group,
            step,
            extra={"event": "microstep.claimed", **where, "micro_steps": n},
        )
        t0 = time.perf_counter()
        stats = self.trainer.compute(step, version, group, indices, snapshot_dir, fetch)
        seconds = time.perf_counter() - t0
        log.info(
            "cell %d: %d micro-steps of g%d done in %.2f s",
            self.index,
            n,
            group,
            seconds,
            extra={
                "event": "microstep.done",
                **where,
                "micro_steps": n,
                "target_tokens": stats.tokens,
                "seconds": round(seconds, 4),
            },
        )
        return stats

    def reduce(self, k: int, stats: ObjectiveStats) -> None:
        """A satellite's part of the step's reduce over cells 0..k-1."""
        self.trainer.reduce(self._comm(), k, stats)

    def finish_step(
        self,
        k: int,
        stats: ObjectiveStats,
        n_scored: int,
        groups: list[str],
        snapshot_dir: str,
        checkpoint_dir: str,
        total_steps: int | None,
    ) -> dict[str, Any]:
        """Core: reduce over cells 0..k-1, the optimizer step (gyre.train.step), snapshot,
        checkpoint when trainer.checkpoint says it is due."""
        t0 = time.perf_counter()
        m = self.trainer.finish_step(
            self._comm(), k, stats, n_scored, groups, snapshot_dir, checkpoint_dir, total_steps
        )
        seconds = time.perf_counter() - t0
        tokens = int(m.get("actor/target_tokens", 0))
        signal = bool(n_scored and tokens)  # without: the weights stay, the version advances
        if self.local:  # the core's step is its leader's record (the metrics are rank 0's)
            return m
        log.info(
            "cell %d: optimizer step -> v%d over %d cells%s in %.2f s",
            self.index,
            self.trainer.version,
            k,
            "" if signal else " (no signal)",
            seconds,
            extra={
                "event": "optimizer_step",
                "cell": self.index,
                "version": self.trainer.version,
                "cells": k,
                "signal": signal,
                "executions": n_scored,
                "target_tokens": tokens,
                "grad_norm": m.get("actor/grad_norm"),
                "seconds": round(seconds, 4),
            },
        )
        return m

    def snapshot(self, snapshot_dir: str) -> int:
        """Core: publish the current weights for joining satellites (at start)."""
        return self.trainer.snapshot(snapshot_dir)

    def save_hf(self, out_dir: str) -> dict[str, float]:
        """Core: the current weights as a Hugging Face directory (what engines reload from disk);
        returns their fingerprints, which every engine must report back (runtime.publication)."""
        from gyre.train.trainer import write_published  # lazy: it loads torch

        model = self.trainer.whole_model()  # G > 1: collective, the whole weights on rank 0
        if model is None:  # not the cell's rank 0: its part was the gather
            return {}
        write_published(model, self.tcfg.model_dir, out_dir)
        return fingerprints(model)

    def publish_in_memory(self, version: int, urls: list[str]) -> dict:
        """Core, ``run.publication = "distributed"``: the current weights into the engines at
        ``urls`` over a weight group (runtime.publication.MemoryPublisher.publish's answer)."""
        from gyre.train.weights import named_params  # lazy, as torch above: it loads torch

        model = self.trainer.whole_model()  # G > 1: collective, the whole weights on rank 0
        if model is None:
            return {}
        if getattr(self, "_publisher", None) is None:
            self._publisher = MemoryPublisher(node_ip())
        params = named_params(model)
        return self._publisher.publish(version, params, urls)


# what an embedded engine did in its rollout phase, for the switch record that ends it: its
# prefix cache (hits, misses, tokens served from it) against the tokens it prefilled, which
# is how much a conversation's growing prefix is reused across its turns
SERVED = ("prefix_cache_hits", "prefix_cache_misses", "prefix_cache_hit_tokens", "prefill_tokens")


def _served(svc: EngineService | None) -> dict[str, dict[str, int]]:
    st = svc.engine.stats() if svc is not None and svc.engine is not None else {}
    got = {k: int(st[k]) for k in SERVED if k in st}
    return {"engine": got} if got else {}


def _start_timeout(ecfg: RolloutEngineConfig) -> float:
    """How long an engine's server may take to accept requests (a vLLM launch is minutes)."""
    return ecfg.vllm.start_timeout_s + 30.0 if ecfg.kind == "vllm" else 120.0


async def _pause(url: str) -> None:
    async with EngineClient(url) as c:
        await c.pause()


async def _wake(url: str, weights_dir: str, version: int) -> None:
    """A parked engine serves ``weights_dir`` at ``version``: reload (unless it already holds
    that version, e.g. it parked right after a publication), then resume."""
    async with EngineClient(url) as c:
        if (await c.model_info()).weight_version != version:
            await c.update_weights_from_disk(weights_dir, weight_version=version)
        await c.resume()


class StandaloneEngine:
    """An engine of the standalone rollout pool (C_s): serves rollouts for the whole run, never trains."""

    def __init__(
        self,
        engine_cfg: RolloutEngineConfig,
        torch_threads: int = 1,
        engine_key: str | None = None,
        log_spec: LogSpec | None = None,
    ):
        (log_spec or LogSpec()).apply()
        os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))
        use_api_key(engine_key)  # before the service: it reads the key when built
        self.timeout = _start_timeout(engine_cfg)
        self.name = engine_cfg.engine_id or "standalone"
        self.version = engine_cfg.weight_version
        self.service = EngineService(
            cell_engine_config(
                engine_cfg,
                model_dir=engine_cfg.model_dir,
                engine_id=engine_cfg.engine_id or "standalone",
                version=engine_cfg.weight_version,
                seed=engine_cfg.seed,
                torch_threads=torch_threads,
            ),
            host=node_ip(),  # its Ray node's IP: 127.0.0.1 on a local run
        )

    def start(self) -> str:
        t0 = time.perf_counter()
        url = self.service.start(timeout=self.timeout)
        seconds = time.perf_counter() - t0
        log.info(
            "%s: serving v%d in %.2f s",
            self.name,
            self.version,
            seconds,
            extra={
                "event": "engine_start",
                "engine": self.name,
                "version": self.version,
                "seconds": round(seconds, 4),
            },
        )
        return url

    def stop(self) -> None:
        self.service.stop()

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()
