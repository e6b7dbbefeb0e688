"""Starting on Ray: connecting (or starting a local instance), and what the cells ask of it.

A run's mistakes here are the user's (an address nothing answers at, resources no node
offers): each is one :class:`RuntimeSetupError` line, before any actor waits forever.
The engines' environment holds no secret: Ray's runtime-env agent logs it world-readable.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import ray

from gyre.cli_errors import first_line
from gyre.engine.service import RELOAD_ROOT_ENV
from gyre.runtime.config import GyreConfig
from gyre.runtime.nodeaddr import BIND_HOST_ENV, LOOPBACK, ray_local_ip
from gyre.runtime.rundir import RunDir

# what Ray raises when the actor behind a call is gone (a dead or killed process). A call in
# flight when Ray's memory monitor kills the actor's worker raises OutOfMemoryError, not a
# RayActorError: the actor (max_restarts 0) is as dead, so it is the same fault.
ActorDied = (ray.exceptions.RayActorError, ray.exceptions.OutOfMemoryError)


def actor_died(e: BaseException) -> bool:
    """Whether ``e`` says the actor behind a call is gone (not an error of the call itself)."""
    return isinstance(e, ActorDied)


# A local Ray starts one idle Python worker per logical CPU for tasks to come (each importing
# Ray: ~1 s of CPU). A run's cells and engines never use them: every actor of a run has its
# own runtime_env, so Ray starts a worker of its own for each. On a small machine those idle
# starts compete with the cells' own start for the cores.
NO_PRESTART = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}


class RuntimeSetupError(RuntimeError):
    """The run could not start (Ray, a cell, or the proxy failed to come up)."""


def init_ray(cfg: GyreConfig) -> None:
    """Join the Ray cluster at ``run.ray.address``, or start a local instance (once)."""
    rc = cfg.run.ray
    if ray.is_initialized():
        return
    # Ray's start-up notices stay out of the live view: with configure_logging off its "Started a
    # local Ray instance" (INFO) reaches no handler, the token-auth notice is quieted by
    # gyre.cli_errors.quiet_third_party, and a nightly wheel's usage-stats prompt (a print) is
    # off here. Ray's warnings and errors still come through; workers' output stays in its logs.
    os.environ.setdefault("RAY_USAGE_STATS_PROMPT_ENABLED", "0")
    kw: dict[str, Any] = {
        "include_dashboard": rc.include_dashboard,
        "log_to_driver": False,
        "configure_logging": False,
    }
    if (
        rc.address and rc.address != "auto"
    ):  # Ray retries an unreachable address for minutes: check first
        host, _, port = rc.address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
        except (OSError, ValueError) as e:
            raise RuntimeSetupError(
                f"no Ray cluster answers at {rc.address} ({e}); start one with "
                "`ray start --head` or leave --address out"
            ) from None
    try:
        if rc.address:
            ray.init(address=rc.address, **kw)
        else:  # Ray rewrites 127.0.0.1 to the routable address; 127.0.0.2 stays loopback
            ray.init(
                num_cpus=rc.num_cpus,
                _node_ip_address=ray_local_ip(rc.node_ip),
                _system_config=NO_PRESTART,
                **kw,
            )
    # broad on purpose: ray.init fails in many ways (a bad --address, a local node that did not
    # come up in time: ConnectionError, RuntimeError, TimeoutError, ValueError), each one line
    except Exception as e:
        where = f"cluster at {rc.address}" if rc.address else "local Ray instance"
        raise RuntimeSetupError(f"the {where} did not start: {first_line(e)[:300]}") from None


def engine_env(cfg: GyreConfig, rundir: RunDir) -> dict[str, str]:
    """The environment of a run's cells and standalone engines: the only folder their engines
    reload from, and on a local run the loopback address their servers bind. Not the engine
    key: Ray's runtime-env agent logs these variables in a world-readable file, so the key goes
    as an actor argument."""
    env = {RELOAD_ROOT_ENV: str(rundir.weights)}
    if not cfg.run.ray.address:
        env[BIND_HOST_ENV] = LOOPBACK
    return env


def cell_resources(cfg: GyreConfig, cell: int) -> dict[str, float]:
    """The custom Ray resources cell ``cell`` asks for: ``run.cell.resources`` plus its own
    entry of ``run.cell_resources`` (which pins it to the nodes that offer them)."""
    per_cell = cfg.run.cell_resources
    return {**cfg.run.cell.resources, **(per_cell[cell] if cell < len(per_cell) else {})}


def check_resources(asks: list[dict[str, float]], offered: dict[str, float]) -> None:
    """Refuse at once custom resources the cluster cannot give: Ray would keep an actor pending
    forever (the run would hang at start instead of saying why). Actors hold their resources for
    the whole run, so the asks are summed. Totals only: a resource split across nodes, none of
    which holds enough for one actor, still waits."""
    total: dict[str, float] = {}
    for ask in asks:
        for name, amount in ask.items():
            total[name] = total.get(name, 0.0) + amount
    for name, amount in total.items():
        have = offered.get(name, 0.0)
        if amount > have + 1e-9:
            raise RuntimeSetupError(
                f"the cells ask for Ray resource {name}={amount:g} in all (run.cell.resources, "
                f"run.cell_resources), the cluster offers {have:g}; give a node more with "
                f"`ray start --resources '{{\"{name}\": N}}'`"
            )
