"""Free TCP ports, picked by the process (on the node) that will listen on them.

A leaf module (standard library only; torch only inside the store helpers), so the engine, the trainer, the runtime, the tests and
the benchmarks share one helper. A port picked here is free *now*: the caller binds it soon
after, and asks for all the ports it needs in one call so no two picks collide.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any


def free_ports(n: int = 1, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free on ``host`` now (all sockets held open together, so the OS
    cannot hand one out twice). Picked by the node that will listen on them: one machine's view
    of its own ports says nothing about another machine's."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def tcp_store(
    host: str,
    port: int,
    world_size: int,
    is_master: bool,
    *,
    timeout: datetime.timedelta,
    wait_for_workers: bool = True,
    multi_tenant: bool = False,
) -> Any:
    """A ``TCPStore`` whose master listens on ``host:port`` only. torch's own master binds every
    interface (``[::]:port``) whatever ``host`` says, which put a local run's gloo rendezvous on
    the network; here the master gets a socket bound to ``host`` (``master_listen_fd``; the
    store owns it from then on). Here, not in gyre.train, because the engine's weight-update
    group needs the same store and may not import the trainer."""
    import torch.distributed as dist  # lazy: torch stays out of processes that only pick ports

    fd = None
    if is_master:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(max(128, world_size))
        except OSError:
            sock.close()
            raise
        fd = sock.detach()
    try:
        return dist.TCPStore(
            host,
            port,
            world_size,
            is_master,
            timeout=timeout,
            wait_for_workers=wait_for_workers,
            multi_tenant=multi_tenant,
            master_listen_fd=fd,
        )
    except BaseException:
        if fd is not None:
            socket.close(fd)
        raise


def world_store(
    host: str,
    port: int,
    world_size: int,
    is_master: bool,
    *,
    timeout: datetime.timedelta,
    store_file: str | None = None,
) -> Any:
    """The rendezvous store of a process group. With ``store_file`` a ``FileStore`` there: only
    processes that can open the file reach it, and the caller puts it in a folder only the
    run's user can enter (mode 0700), a fresh file per world (a killed rank never removes its
    part of one). Otherwise :func:`tcp_store` on ``host:port``, which anyone who can reach that
    port can read and write (torch's TCPStore has no authentication): any local user on
    loopback, any host on the network. A FileStore is for processes of one machine only."""
    if store_file is None:
        return tcp_store(host, port, world_size, is_master, timeout=timeout, multi_tenant=True)
    import torch.distributed as dist  # lazy: see tcp_store

    store = dist.FileStore(store_file, world_size)
    store.set_timeout(timeout)
    return store
