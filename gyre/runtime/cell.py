"""One cell: a long-lived process that holds an engine (rollout) or a training replica (training).

The controller wraps :class:`Cell` with ``ray.remote`` and moves it between roles in
place, as the paper does: the process, its torch.distributed world and the prefix
communicators stay alive across switches; only the engine or the replica is built
and dropped. Cell 0 is the core: it alone holds the optimizer state and the
authoritative weights, and keeps them (in host memory) while it serves rollouts.

Nothing here schedules: every method is one step of an action the policy chose.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gyre.runtime.seeds import SEED_STRIDE

if TYPE_CHECKING:
    import torch

    from gyre.engine.service import EngineService
    from gyre.train.cell import TrainCell
    from gyre.train.checkpoint import TrainerState
    from gyre.train.replica import ReplicaWorker

# weight snapshots satellites pull (weights/snapshots, one model each): a step's participants pull
# its version, and the next step starts only after every one of them has reduced, so the current
# version plus one spare is enough
SNAPSHOTS_KEPT = 2


class Cell:
    def __init__(
        self,
        index: int,
        world: int,
        trainer_cfg: dict,
        engine_cfg: dict,
        torch_threads: int = 1,
        cpu_quota: float | None = None,
        engine_key: str | None = None,
    ):
        from gyre.engine.client import use_api_key

        use_api_key(engine_key)  # the run's engine key: its engines want it, its clients send it
        self.cgroup: str | None = None  # the cell's own cgroup under run.cell.cpu_quota
        if cpu_quota is not None:  # before any thread starts: all of them land in the group
            from gyre.runtime.cpulimit import confine

            self.cgroup = str(confine(os.getpid(), cpu_quota))
        os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))
        import torch

        torch.set_num_threads(torch_threads)
        from gyre.runtime.engines import RolloutEngineConfig
        from gyre.train.config import TrainerConfig

        self.index, self.world = index, world
        self.tcfg = TrainerConfig.model_validate(trainer_cfg)
        self.engine_cfg, self.torch_threads = engine_cfg, torch_threads
        self.ecfg = RolloutEngineConfig.model_validate(engine_cfg)
        self.cell: TrainCell | None = None  # process group + prefix communicators
        self.engine: EngineService | None = None  # while in rollout (a vLLM one: for life)
        self.parked = False  # the engine is kept, paused, while the cell trains (vLLM)
        self.worker: ReplicaWorker | None = None  # while training (the core keeps it)
        self.optimizer: torch.optim.Optimizer | None = None  # core only
        self.version = -1  # policy version of the replica's weights
        self.state: TrainerState | None = None  # core only

    def _train_cell(self) -> TrainCell:
        if self.cell is None:
            raise RuntimeError(f"cell {self.index} is not set up (call setup() first)")
        return self.cell

    def _replica(self) -> ReplicaWorker:
        if self.worker is None:
            raise RuntimeError(f"cell {self.index} has no training replica")
        return self.worker

    def _core(self) -> tuple[torch.optim.Optimizer, TrainerState]:
        """The core's optimizer and trainer state (built by its first load_replica)."""
        if self.optimizer is None or self.state is None:
            raise RuntimeError(f"cell {self.index} holds no optimizer (only the core does)")
        return self.optimizer, self.state

    # ---------------------------------------------------------------- plumbing (once)
    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def group(self) -> str | None:
        """The cgroup holding this cell to its CPU quota (None: no quota)."""
        return self.cgroup

    def node_ip(self) -> str:
        """The IP of the node this cell runs on (nodes on one machine share it; the id tells
        apart). Its engines bind it; the core's also hosts the cells' gloo world."""
        from gyre.runtime.nodeaddr import node_ip

        return node_ip()

    def free_ports(self, n: int) -> list[int]:
        """``n`` ports free on this cell's node (the core's: where the gloo world listens)."""
        from gyre.runtime.nodeaddr import free_ports, node_ip

        return free_ports(node_ip(), n)

    def setup(self, dist_port: int, store_port: int, host: str = "127.0.0.1") -> None:
        """Join the cells' gloo world, served by the core at ``host`` (its node IP), and build
        every prefix communicator (collective: all cells at once). On a non-loopback node the
        cell's own gloo sockets bind the interface holding its node IP (see nodeaddr)."""
        from gyre.runtime.nodeaddr import gloo_env, ipv4_interfaces, node_ip
        from gyre.train.cell import TrainCell

        os.environ.update(gloo_env(node_ip(), dict(os.environ), ipv4_interfaces()))
        cell = self.cell = TrainCell(
            self.index, self.world, dist_port=dist_port, store_port=store_port, host=host
        )
        cell.setup()

    def teardown(self) -> None:
        self.stop_engine()
        if self.cell is not None:
            self.cell.teardown()
            self.cell = None

    # ---------------------------------------------------------------- rollout role
    def start_engine(self, weights_dir: str, version: int) -> str:
        """Serve ``weights_dir`` (policy ``version``); returns the engine's URL. A kept (parked)
        engine reloads those weights in place and resumes; otherwise a fresh one starts."""
        from gyre.engine.service import EngineService
        from gyre.runtime.engines import cell_engine_config

        if self.engine is not None and self.parked and self.engine.url is not None:
            _run(_wake(self.engine.url, weights_dir, version))
            self.parked = False
            return self.engine.url
        seed = (
            self.ecfg.seed * SEED_STRIDE + self.index * 7919 + version
        )  # distinct streams per cell and start
        cfg = cell_engine_config(
            self.engine_cfg,
            model_dir=weights_dir,
            engine_id=f"cell-{self.index}",
            version=version,
            seed=seed,
            torch_threads=self.torch_threads,
        )
        svc = EngineService(cfg, host=self.node_ip())  # reachable from the driver's node
        url = svc.start(timeout=_start_timeout(self.ecfg))
        self.engine = svc
        self.parked = False
        return url

    def park_engine(self) -> None:
        """Leave rollout (the proxy has drained the engine). The embedded engine is dropped, its
        weights and K/V with it; a vLLM server (30-90 s to start) is paused and kept."""
        from gyre.runtime.engines import keeps_engine

        if self.engine is None or self.engine.url is None or not keeps_engine(self.engine_cfg):
            self.stop_engine()
            return
        _run(_pause(self.engine.url))
        self.parked = True

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
        """Become a training replica at ``version``; returns the seconds it took.

        The core builds its optimizer once (from a checkpoint on resume) and keeps it;
        a satellite pulls the core's snapshot of ``version``.
        """
        t0 = time.perf_counter()
        from gyre.train.replica import ReplicaWorker

        if self.index == 0:
            if self.worker is None:
                self._start_core(resume_from)
            self.snapshot(snapshot_dir)  # what joining satellites pull
        else:
            worker = self.worker = ReplicaWorker(self.tcfg)
            worker.start(self.tcfg.model_dir)
            self.version = -1
            self._pull(version, snapshot_dir)
        return time.perf_counter() - t0

    def _start_core(self, resume_from: str | None) -> None:
        import torch

        from gyre.train.checkpoint import TrainerState, load_optimizer, load_state
        from gyre.train.core import build_optimizer
        from gyre.train.replica import ReplicaWorker

        torch.manual_seed(self.tcfg.seed)
        worker = self.worker = ReplicaWorker(self.tcfg)
        worker.start(resume_from or self.tcfg.model_dir)
        optimizer = self.optimizer = build_optimizer(worker.params, self.tcfg.optim)
        state = self.state = TrainerState(model_source=self.tcfg.model_dir)
        if resume_from:
            load_optimizer(Path(resume_from), optimizer)
            state = self.state = load_state(Path(resume_from))
        self.version = state.policy_version

    def _pull(self, version: int, snapshot_dir: str) -> None:
        if version == self.version:
            return
        from gyre.train.weights import FileWeightChannel, load_params

        load_params(self._replica().live_model, FileWeightChannel(snapshot_dir).pull(version))
        self.version = version

    def drop_replica(self) -> None:
        """Satellites drop their replica; the core keeps weights and optimizer state (host memory)."""
        if self.index != 0:
            self.worker = None
            self.version = -1

    def compute(
        self, step: int, version: int, tasks: list[bytes], indices: list[int], snapshot_dir: str
    ) -> list:
        """Forward/backward of some of a group's micro-steps; gradients accumulate. Returns summed stats."""
        from gyre.train.objective import ObjectiveStats
        from gyre.train.tasks import MicroStepTask

        if self.worker is None:
            raise RuntimeError(f"cell {self.index} has no training replica")
        if self.index != 0:
            self._pull(version, snapshot_dir)
        elif self.version != version:
            raise RuntimeError(f"core holds version {self.version}, step {step} needs {version}")
        by_index = {t.index: t for t in (MicroStepTask.from_bytes(b) for b in tasks)}
        stats = ObjectiveStats()
        for i in indices:
            stats.add(
                self.worker.compute(
                    by_index[i], step=step, get_task=by_index.__getitem__, version=version
                )
            )
        return stats.as_list()

    def reduce(self, k: int, stats: list) -> None:
        """A satellite's part of the step's reduce over cells 0..k-1; its gradients are then cleared."""
        from gyre.train.core import reduce_step
        from gyre.train.objective import ObjectiveStats

        worker = self._replica()
        reduce_step(worker, self._train_cell().comm, k, ObjectiveStats.from_list(stats))
        worker.zero_grad()
        worker.new_step()

    def finish_step(
        self,
        k: int,
        stats: list,
        n_scored: int,
        groups: list[str],
        snapshot_dir: str,
        checkpoint_dir: str | None,
        keep: int = 2,
    ) -> dict[str, Any]:
        """Core: reduce over cells 0..k-1, scale by 1/E, clip, step once, snapshot, checkpoint."""
        import math

        import torch

        from gyre.train.checkpoint import save_checkpoint
        from gyre.train.core import reduce_step
        from gyre.train.objective import ObjectiveStats
        from gyre.train.weights import FileWeightChannel, named_params

        worker = self._replica()
        optimizer, state = self._core()
        t0 = time.perf_counter()
        total = reduce_step(worker, self._train_cell().comm, k, ObjectiveStats.from_list(stats))
        t_reduce = time.perf_counter() - t0
        params = worker.params
        E = n_scored
        m: dict[str, Any] = {
            "actor/loss": total.loss_sum / E if E else 0.0,
            "actor/token_capfrac": total.tokens_capped / total.tokens if total.tokens else 0.0,
            "actor/pg_clipfrac": total.exec_clipped_weight / total.exec_weight
            if total.exec_weight
            else 0.0,
            "actor/target_tokens": float(total.tokens),
            "actor/grad_norm": 0.0,
            **total.mismatch_metrics(),
        }
        if E and total.tokens:
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.grad.div_(E)
            clip = self.tcfg.optim.grad_clip
            m["actor/grad_norm"] = float(
                torch.nn.utils.clip_grad_norm_(params, clip if clip else math.inf)
            )
            optimizer.step()
        # The version advances every step (a step without signal leaves the weights as they are), so
        # policy versions and optimizer steps stay one and the same count.
        worker.zero_grad()
        worker.new_step()
        state.step += 1
        state.policy_version += 1
        state.consumed_groups.extend(groups)
        self.version = state.policy_version
        t1 = time.perf_counter()
        FileWeightChannel(snapshot_dir, keep=SNAPSHOTS_KEPT).publish(
            self.version, named_params(worker.live_model)
        )
        m["timing/snapshot"] = time.perf_counter() - t1
        if checkpoint_dir:
            t1 = time.perf_counter()
            save_checkpoint(checkpoint_dir, worker.live_model, optimizer, state, keep=keep)
            m["timing/checkpoint"] = time.perf_counter() - t1
        m["timing/reduce"] = t_reduce
        m["timing/finish_step"] = time.perf_counter() - t0
        return m

    def snapshot(self, snapshot_dir: str) -> int:
        """Core: publish the current weights for joining satellites (at start)."""
        from gyre.train.weights import FileWeightChannel, named_params

        FileWeightChannel(snapshot_dir, keep=SNAPSHOTS_KEPT).publish(
            self.version, named_params(self._replica().live_model)
        )
        return self.version

    def save_hf(self, out_dir: str) -> dict[str, float]:
        """Core: the current weights as a Hugging Face directory (what engines reload from disk);
        returns their fingerprints, which every engine must report back (runtime.publication)."""
        import shutil

        from gyre.engine.checksum import fingerprints
        from gyre.train.checkpoint import write_hf

        model = self._replica().live_model
        tmp = Path(out_dir + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write_hf(model, self.tcfg.model_dir, tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(tmp, out_dir)
        return fingerprints(model)


def _start_timeout(ecfg: Any) -> float:
    """How long an engine's server may take to accept requests (a vLLM launch is minutes)."""
    return ecfg.vllm.start_timeout_s + 30.0 if ecfg.kind == "vllm" else 120.0


def _run(coro: Any) -> Any:
    """Run one control coroutine from a cell's (synchronous) actor method."""
    import asyncio

    return asyncio.run(coro)


async def _pause(url: str) -> None:
    from gyre.engine.client import EngineClient

    async with EngineClient(url) as c:
        await c.pause()


async def _wake(url: str, weights_dir: str, version: int) -> None:
    """A parked engine serves ``weights_dir`` at ``version``: reload (unless it already holds
    that version, e.g. it parked right after a publication), then resume."""
    from gyre.engine.client import EngineClient

    async with EngineClient(url) as c:
        if (await c.model_info()).weight_version != version:
            await c.update_weights_from_disk(weights_dir, weight_version=version)
        await c.resume()


class StandaloneEngine:
    """An engine of the standalone rollout pool (C_s): serves rollouts for the whole run, never trains."""

    def __init__(self, engine_cfg: dict, torch_threads: int = 1, engine_key: str | None = None):
        os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))
        from gyre.engine.client import use_api_key
        from gyre.engine.service import EngineService
        from gyre.runtime.engines import RolloutEngineConfig, cell_engine_config
        from gyre.runtime.nodeaddr import node_ip

        use_api_key(engine_key)  # before the service: it reads the key when built

        rc = RolloutEngineConfig.model_validate(engine_cfg)
        self.timeout = _start_timeout(rc)
        self.service = EngineService(
            cell_engine_config(
                engine_cfg,
                model_dir=rc.model_dir,
                engine_id=rc.engine_id or "standalone",
                version=rc.weight_version,
                seed=rc.seed,
                torch_threads=torch_threads,
            ),
            host=node_ip(),  # its Ray node's IP: 127.0.0.1 on a local run
        )

    def start(self) -> str:
        return self.service.start(timeout=self.timeout)

    def stop(self) -> None:
        self.service.stop()

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()
