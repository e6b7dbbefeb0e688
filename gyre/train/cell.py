"""One cell's training plumbing in a single object, ready for ``ray.remote`` or a plain process.

A cell process needs three shared things, built once and kept while the cell moves
between rollout and training: the torch.distributed world with its prefix
communicators, a client of the coordination store, and its rank. ``TrainCell`` holds
exactly those (no globals, explicit ``setup``/``teardown``). ``gyre run``'s cell actor
(:mod:`gyre.runtime.cell`) holds one; the ``gyre train demo`` rig (:mod:`gyre.train.demo.local`)
runs one per OS process and builds its core or a satellite on top for each run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed import TCPStore

    from gyre.train.comm import PrefixCommunicators


class TrainCell:
    def __init__(
        self,
        rank: int,
        world: int,
        *,
        dist_port: int,
        store_port: int | None,
        host: str = "127.0.0.1",
        backend: str = "gloo",
        timeout_s: float = 120.0,
        store_file: str | None = None,
    ):
        self.rank, self.world, self.host, self.backend = rank, world, host, backend
        self.dist_port, self.store_port, self.timeout_s = dist_port, store_port, timeout_s
        self.store_file = store_file
        self.comm: PrefixCommunicators | None = None
        self.store: TCPStore | None = None

    @property
    def is_core(self) -> bool:
        return self.rank == 0

    def setup(self) -> None:
        """Join the cells' process group (its rendezvous a FileStore at ``store_file`` when
        given, else a TCPStore on ``dist_port``), build every prefix communicator, connect the
        coordination store (cell 0 serves it; none without ``store_port``: ``gyre run`` sends
        micro-steps through Ray and needs none)."""
        import datetime

        from gyre.ports import tcp_store
        from gyre.train.comm import init_cell_process

        self.comm = init_cell_process(
            self.rank,
            self.world,
            self.dist_port,
            backend=self.backend,
            host=self.host,
            timeout_s=self.timeout_s,
            store_file=self.store_file,
        )
        if self.store_port is None:
            return
        self.store = tcp_store(
            self.host,
            self.store_port,
            self.world,
            self.is_core,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def teardown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        self.comm = self.store = None
