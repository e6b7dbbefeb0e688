"""The shared claim queue and step membership, behind one small interface.

One *step* = one batch = one optimizer step on the core. Its coordinator state:

* a claim queue of :class:`MicroStepTask` items, filled by the producer (the core's
  packing buffer) as groups land and then *closed* with the batch's size;
* *tickets*: a claim takes the next ticket number t and then waits for item t to
  exist; it gets ``None`` once the step is closed with fewer than t+1 items. So every
  item is processed exactly once, whoever claims it, and replicas that find the
  queue empty pause until the producer catches up (or the step closes);
* *membership*: cells join in fixed order (core = cell 0 first), so the set of
  participants is always the prefix 0..k-1 and one of the prebuilt prefix
  communicators covers it exactly. The core *seals* the step once every item is
  done; a satellite that comes later does not join.

Two backends: :class:`LocalCoordinator` (one process) and
:class:`StoreCoordinator` (any ``torch.distributed.Store``, e.g. a TCPStore on
127.0.0.1, shared by separate processes). Nothing here is global.

**Whose it is:** the rig of ``gyre train demo`` (:mod:`gyre.train.demo.local`), its tests and the
training benchmarks, where replicas claim work themselves. It is not part of ``gyre run``:
there the scheduling policy assigns every micro-step (``ClaimMicroStep``) and the runtime's
world carries it to a cell, so no claim queue exists. Both share the replica, the reduce and
the optimizer step (:mod:`gyre.train.step`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from gyre.train.tasks import MicroStepTask

Idle = Callable[[], None] | None


class StepStalled(RuntimeError):
    """A step made no progress for ``stall_timeout_s`` (e.g. a replica died holding a micro-step)."""


@dataclass
class StepSeal:
    """What every participant needs at the end of a step."""

    step: int
    policy_version: int
    participants: int  # k: cells 0..k-1 took part
    n_items: int
    n_scored: int  # E: scored executions of the batch (1/E scales the gradient)
    meta: dict = field(default_factory=dict)
    claims: dict[int, int] = field(default_factory=dict)  # cell -> micro-steps it processed


class StepCoordinator(Protocol):
    """What the core, satellites and a producer need from the claim queue."""

    def open_step(self, step: int, policy_version: int) -> None: ...
    def put(self, step: int, task: MicroStepTask) -> None: ...
    def close(self, step: int, n_scored: int, meta: dict | None = None) -> None: ...
    def current_step(self) -> tuple[int, int] | None: ...
    def join(self, step: int, cell: int) -> bool: ...
    def claim(self, step: int, idle: Idle = None) -> MicroStepTask | None: ...
    def get(self, step: int, index: int) -> MicroStepTask: ...
    def done(self, step: int, index: int, cell: int) -> None: ...
    def n_done(self, step: int) -> int: ...
    def seal(self, step: int, idle: Idle = None) -> StepSeal: ...
    def wait_seal(self, step: int) -> StepSeal: ...
    def is_sealed(self, step: int) -> bool: ...


class _Stall:
    """Raises StepStalled when ``progress`` stops changing for ``timeout`` seconds."""

    def __init__(self, timeout: float, what: str):
        self.timeout, self.what = timeout, what
        self.last, self.t = None, time.monotonic()

    def tick(self, progress) -> None:
        now = time.monotonic()
        if progress != self.last:
            self.last, self.t = progress, now
        elif now - self.t > self.timeout:
            raise StepStalled(
                f"no progress for {self.timeout:.0f}s while {self.what} (state {progress})"
            )


class _Backoff:
    """Sleep between polls: starts at ``poll_s``, grows 1.5x per idle poll up to ``cap_s``.

    Waiting replicas then cost little CPU (they share cores with the ones computing),
    while a short wait still ends within a few milliseconds.
    """

    def __init__(self, poll_s: float, cap_s: float = 0.02):
        self.d, self.cap = poll_s, max(cap_s, poll_s)

    def sleep(self) -> None:
        time.sleep(self.d)
        self.d = min(self.d * 1.5, self.cap)


class StoreCoordinator:
    """Coordinator over a ``torch.distributed.Store`` (TCPStore, FileStore, ...).

    Every process builds its own instance on its own client of the same store; keys
    live under ``namespace`` so several runs can share one store.
    """

    def __init__(
        self,
        store,
        namespace: str = "gyre",
        *,
        poll_s: float = 0.005,
        stall_timeout_s: float = 600.0,
    ):
        self.store, self.ns, self.poll_s, self.stall_timeout_s = (
            store,
            namespace,
            poll_s,
            stall_timeout_s,
        )
        self._n_put: dict[int, int] = {}

    def _k(self, step: int, name: str) -> str:
        return f"{self.ns}/s{step}/{name}"

    def _has(self, key: str) -> bool:
        return self.store.check([key])

    def _int(self, key: str) -> int:
        return int(self.store.add(key, 0))

    # producer -------------------------------------------------------------------------
    def open_step(self, step: int, policy_version: int) -> None:
        self._forget(step - 2)  # everyone is done with it: step - 1 was sealed after it
        self._reset(step)  # an abandoned earlier attempt at this step leaves no stale counters
        self.store.set(self._k(step, "members"), "1")  # the core is cell 0
        self.store.set(self._k(step, "version"), str(policy_version))
        self._n_put[step] = 0
        self.store.set(f"{self.ns}/current", json.dumps([step, policy_version]))

    def _forget(self, step: int) -> None:
        """Drop an old step's micro-steps from the store (bounded memory over a long run)."""
        closed = self._closed(step) if step >= 0 else None
        if closed is None:
            return
        for i in range(closed["total"]):
            self.store.delete_key(self._k(step, f"item/{i}"))
        self._n_put.pop(step, None)

    def _reset(self, step: int) -> None:
        key = self._k(step, "members")
        if not self._has(key):
            return
        k = int(self.store.get(key).decode().split(":")[-1])
        n = self._int(self._k(step, "n_put"))
        for name in (
            ["closed", "seal", "ticket", "n_put", "n_done", "version"]
            + [f"claims/{c}" for c in range(k)]
            + [f"item/{i}" for i in range(n)]
        ):
            self.store.delete_key(self._k(step, name))

    def put(self, step: int, task: MicroStepTask) -> None:
        i = self._n_put[step]
        if task.index != i:
            raise ValueError(f"micro-step index {task.index} put out of order (expected {i})")
        self.store.set(self._k(step, f"item/{i}"), task.to_bytes())  # item first, then the count
        self.store.add(self._k(step, "n_put"), 1)
        self._n_put[step] = i + 1

    def close(self, step: int, n_scored: int, meta: dict | None = None) -> None:
        self.store.set(
            self._k(step, "closed"),
            json.dumps({"total": self._n_put[step], "n_scored": n_scored, "meta": meta or {}}),
        )

    # participants ---------------------------------------------------------------------
    def current_step(self) -> tuple[int, int] | None:
        key = f"{self.ns}/current"
        if not self._has(key):
            return None
        s, v = json.loads(self.store.get(key))
        return int(s), int(v)

    def join(self, step: int, cell: int) -> bool:
        key = self._k(step, "members")
        stall = _Stall(self.stall_timeout_s, f"cell {cell} waits to join step {step}")
        wait = _Backoff(self.poll_s)
        while True:
            if self._has(key):
                v = self.store.get(key).decode()
                if v.startswith("sealed"):
                    return False
                if int(v) == cell:
                    got = self.store.compare_set(key, str(cell), str(cell + 1)).decode()
                    if got == str(cell + 1):
                        return True
                    continue
                if int(v) > cell:
                    raise RuntimeError(f"cell {cell} already joined step {step} (members={v})")
            stall.tick(self.store.get(key).decode() if self._has(key) else None)
            wait.sleep()

    def _closed(self, step: int) -> dict | None:
        key = self._k(step, "closed")
        return json.loads(self.store.get(key)) if self._has(key) else None

    def claim(self, step: int, idle: Idle = None) -> MicroStepTask | None:
        t = int(self.store.add(self._k(step, "ticket"), 1)) - 1
        stall = _Stall(self.stall_timeout_s, f"waiting for micro-step {t} of step {step}")
        wait = _Backoff(self.poll_s)
        while True:
            n_put = self._int(self._k(step, "n_put"))
            if t < n_put:
                return self.get(step, t)
            closed = self._closed(step)
            if closed is not None and t >= closed["total"]:
                return None
            if idle is not None:
                idle()
            stall.tick(n_put)
            wait.sleep()

    def get(self, step: int, index: int) -> MicroStepTask:
        return MicroStepTask.from_bytes(self.store.get(self._k(step, f"item/{index}")))

    def done(self, step: int, index: int, cell: int) -> None:
        self.store.add(self._k(step, f"claims/{cell}"), 1)
        self.store.add(self._k(step, "n_done"), 1)

    def n_done(self, step: int) -> int:
        return self._int(self._k(step, "n_done"))

    def seal(self, step: int, idle: Idle = None) -> StepSeal:
        stall = _Stall(self.stall_timeout_s, f"sealing step {step}")
        wait = _Backoff(self.poll_s)
        while True:
            closed = self._closed(step)
            nd = self.n_done(step)
            if closed is not None and nd >= closed["total"]:
                break
            if idle is not None and closed is None:
                idle()
            stall.tick((nd, closed is not None))
            wait.sleep()
        key = self._k(step, "members")
        while True:
            k = self.store.get(key).decode()
            if self.store.compare_set(key, k, f"sealed:{k}").decode() == f"sealed:{k}":
                break
        k = int(k)
        seal = StepSeal(
            step=step,
            policy_version=int(self.store.get(self._k(step, "version"))),
            participants=k,
            n_items=closed["total"],
            n_scored=closed["n_scored"],
            meta=closed["meta"],
            claims={c: self._int(self._k(step, f"claims/{c}")) for c in range(k)},
        )
        self.store.set(self._k(step, "seal"), json.dumps(asdict(seal)))
        return seal

    def is_sealed(self, step: int) -> bool:
        return self._has(self._k(step, "seal"))

    def wait_seal(self, step: int) -> StepSeal:
        key = self._k(step, "seal")
        stall = _Stall(self.stall_timeout_s, f"waiting for the seal of step {step}")
        wait = _Backoff(self.poll_s)
        while not self._has(key):
            stall.tick(self.n_done(step))
            wait.sleep()
        d = json.loads(self.store.get(key))
        d["claims"] = {int(c): n for c, n in d["claims"].items()}
        return StepSeal(**d)


class LocalCoordinator:
    """In-process coordinator (one replica, or threads in one process): same semantics."""

    def __init__(self, *, poll_s: float = 0.001, stall_timeout_s: float = 600.0):
        self.poll_s, self.stall_timeout_s = poll_s, stall_timeout_s
        self._lock = threading.Lock()
        self._steps: dict[int, dict] = {}
        self._current: tuple[int, int] | None = None

    def open_step(self, step: int, policy_version: int) -> None:
        with self._lock:
            self._steps[step] = {
                "items": [],
                "ticket": 0,
                "closed": None,
                "members": 1,
                "sealed": None,
                "done": 0,
                "claims": {},
                "version": policy_version,
            }
            self._current = (step, policy_version)

    def put(self, step: int, task: MicroStepTask) -> None:
        with self._lock:
            s = self._steps[step]
            if task.index != len(s["items"]):
                raise ValueError(
                    f"micro-step index {task.index} put out of order (expected {len(s['items'])})"
                )
            s["items"].append(task.to_bytes())

    def close(self, step: int, n_scored: int, meta: dict | None = None) -> None:
        with self._lock:
            s = self._steps[step]
            s["closed"] = {"total": len(s["items"]), "n_scored": n_scored, "meta": meta or {}}

    def current_step(self) -> tuple[int, int] | None:
        return self._current

    def join(self, step: int, cell: int) -> bool:
        stall = _Stall(self.stall_timeout_s, f"cell {cell} waits to join step {step}")
        wait = _Backoff(self.poll_s)
        while True:
            with self._lock:
                s = self._steps[step]
                if s["sealed"] is not None:
                    return False
                if s["members"] == cell:
                    s["members"] += 1
                    return True
                if s["members"] > cell:
                    raise RuntimeError(f"cell {cell} already joined step {step}")
                m = s["members"]
            stall.tick(m)
            wait.sleep()

    def claim(self, step: int, idle: Idle = None) -> MicroStepTask | None:
        with self._lock:
            s = self._steps[step]
            t = s["ticket"]
            s["ticket"] += 1
        stall = _Stall(self.stall_timeout_s, f"waiting for micro-step {t} of step {step}")
        wait = _Backoff(self.poll_s)
        while True:
            with self._lock:
                n = len(s["items"])
                if t < n:
                    return MicroStepTask.from_bytes(s["items"][t])
                if s["closed"] is not None and t >= s["closed"]["total"]:
                    return None
            if idle is not None:
                idle()
            stall.tick(n)
            wait.sleep()

    def get(self, step: int, index: int) -> MicroStepTask:
        with self._lock:
            return MicroStepTask.from_bytes(self._steps[step]["items"][index])

    def done(self, step: int, index: int, cell: int) -> None:
        with self._lock:
            s = self._steps[step]
            s["done"] += 1
            s["claims"][cell] = s["claims"].get(cell, 0) + 1

    def n_done(self, step: int) -> int:
        with self._lock:
            return self._steps[step]["done"]

    def seal(self, step: int, idle: Idle = None) -> StepSeal:
        stall = _Stall(self.stall_timeout_s, f"sealing step {step}")
        wait = _Backoff(self.poll_s)
        while True:
            with self._lock:
                s = self._steps[step]
                c = s["closed"]
                if c is not None and s["done"] >= c["total"]:
                    k = s["members"]
                    s["sealed"] = StepSeal(
                        step=step,
                        policy_version=s["version"],
                        participants=k,
                        n_items=c["total"],
                        n_scored=c["n_scored"],
                        meta=c["meta"],
                        claims={i: s["claims"].get(i, 0) for i in range(k)},
                    )
                    return s["sealed"]
                progress = (s["done"], c is not None)
            if idle is not None and c is None:
                idle()
            stall.tick(progress)
            wait.sleep()

    def is_sealed(self, step: int) -> bool:
        with self._lock:
            return step in self._steps and self._steps[step]["sealed"] is not None

    def wait_seal(self, step: int) -> StepSeal:
        stall = _Stall(self.stall_timeout_s, f"waiting for the seal of step {step}")
        wait = _Backoff(self.poll_s)
        while True:
            with self._lock:
                s = self._steps[step]
                if s["sealed"] is not None:
                    return s["sealed"]
                d = s["done"]
            stall.tick(d)
            wait.sleep()
