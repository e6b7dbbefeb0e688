"""A satellite cell: joins a running step, pulls the core's snapshot, claims micro-steps.

A satellite holds no optimizer state and no authoritative weights. Joining a step
``s`` (cells join in fixed order 1, 2, ...): take the next membership slot, pull the
weights of the step's policy version (constant during accumulation, so any time
is a consistent time), claim micro-steps until the queue is closed and empty,
then take part in the reduce over the prefix communicator of the k participants.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gyre.train.comm import PrefixCommunicators
from gyre.train.config import TrainerConfig
from gyre.train.demo.coordinator import StepCoordinator, StepSeal
from gyre.train.demo.core import claim_microsteps
from gyre.train.replica import ReplicaWorker
from gyre.train.step import reduce_step
from gyre.train.weights import WeightChannel, load_params


@dataclass
class JoinResult:
    step: int
    micro_steps: int
    seal: StepSeal
    compute_s: float
    cpu_s: float = 0.0  # process CPU time from joining to the end of the reduce


class Satellite:
    def __init__(
        self,
        cell: int,
        cfg: TrainerConfig,
        coordinator: StepCoordinator,
        weights: WeightChannel,
        comm: PrefixCommunicators | None,
    ):
        if cell < 1:
            raise ValueError("satellites are cells 1..K-1 (cell 0 is the core)")
        self.cell, self.cfg, self.coord, self.weights, self.comm = (
            cell,
            cfg,
            coordinator,
            weights,
            comm,
        )
        self.worker = ReplicaWorker(cfg)
        self._version: int | None = None  # policy version of the weights this satellite holds

    def start(self) -> None:
        """Load the architecture (weights are replaced by the core's snapshot on every join)."""
        self.worker.start(self.cfg.model_dir)

    def stop(self) -> None:
        self.worker.stop()
        self._version = None

    def wait_for_step(self, step: int, timeout_s: float = 600.0) -> int | None:
        """Block until the core has opened ``step``; its policy version, or ``None`` if it is already over."""
        t0 = time.monotonic()
        while True:
            cur = self.coord.current_step()
            if cur is not None and cur[0] >= step:
                if cur[0] > step or self.coord.is_sealed(step):
                    return None
                return cur[1]
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"step {step} did not open within {timeout_s}s")
            time.sleep(self.cfg.stream.poll_s)

    def join_step(
        self,
        step: int,
        *,
        max_claims: int | None = None,
        on_microstep: Callable[[int], None] | None = None,
    ) -> JoinResult | None:
        """Join ``step`` (blocks until it is open and it is this cell's turn); ``None`` if it sealed first."""
        version = self.wait_for_step(step)
        if version is None or not self.coord.join(step, self.cell):
            return None
        c0 = time.process_time()
        if version != self._version:  # a satellite that joins two steps in a row pulls once each
            load_params(self.worker.live_model, self.weights.pull(version))
            self._version = version
        self.worker.zero_grad()
        self.worker.new_step()
        stats, n, tc = claim_microsteps(
            self.coord, self.worker, self.cell, step, max_claims, on_microstep, version=version
        )
        seal = self.coord.wait_seal(step)
        reduce_step(self.worker, self.comm, seal.participants, stats)
        self.worker.zero_grad()
        return JoinResult(
            step=step, micro_steps=n, seal=seal, compute_s=tc, cpu_s=time.process_time() - c0
        )
