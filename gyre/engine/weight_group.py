"""The process group weights travel over in memory: the trainer is rank 0, each engine one rank.

The shape is SGLang's (``init_weights_update_group`` then ``update_weights_from_distributed``):
rank 0 broadcasts each named tensor in the order the request lists them. The group is built
without touching torch's default group (a ``TCPStore`` the trainer hosts, a ``PrefixStore``
per group name, a backend process group made directly): an engine process may hold a training
replica whose FSDP mesh owns the default group, and an engine can be in several weight
groups over its life (one per membership of the rollout set). CPU: ``gloo``; GPU: ``nccl``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gyre.ports import tcp_store

if TYPE_CHECKING:
    import torch

BACKENDS = ("gloo", "nccl")


class WeightGroup:
    """One member's end of a weight-update group (a blocking object: call it from a thread).

    The store keys and the backends are laid out as SGLang's ``init_custom_process_group`` lays
    them out through torch's ``_new_process_group_helper`` (a ``PrefixStore`` of the group name,
    then ``"<group>/"``, then the backend under its first device: gloo under ``cpu/``, serving
    CUDA tensors too; NCCL under ``cuda/``), so a real SGLang server and this class meet in the
    same group (tests/integration/test_publication_distributed.py joins one built by torch's
    helper). It is built directly so that two members may live in one process (torch's
    registry allows a group name once per process)."""

    def __init__(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str = "gloo",
        timeout_s: float = 600.0,
    ):
        import torch.distributed as dist

        if backend not in BACKENDS:
            raise ValueError(f"weight-update backend {backend!r}: use one of {BACKENDS}")
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.name, self.backend = rank, world_size, group_name, backend
        # the master's store must live as long as the group: kept on the object
        self._store: Any = tcp_store(
            master_address,
            master_port,
            world_size,
            rank == 0,
            timeout=timeout,
            wait_for_workers=False,
        )
        prefix = dist.PrefixStore(f"{group_name}/", dist.PrefixStore(group_name, self._store))
        self._pg: Any
        if backend == "gloo":  # returns once every member has connected
            store = dist.PrefixStore("cpu/", prefix)
            self._pg = dist.ProcessGroupGloo(store, rank, world_size, timeout)
        else:  # NCCL connects at the first collective
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            store = dist.PrefixStore("cuda/", prefix)
            self._pg = dist.ProcessGroupNCCL(store, rank, world_size, opts)
        self._root = dist.BroadcastOptions()
        self._root.rootRank = 0

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0 sends ``t``; every other rank receives into ``t`` (same dtype and shape)."""
        self._pg.broadcast([t], self._root).wait()
        return t

    def close(self) -> None:
        self._pg = None
        self._store = None
