"""A weight-group member built as SGLang's ``init_custom_process_group`` builds it (and OpenRLHF,
SkyRL, AReaL copy it): torch's rendezvous, a ``PrefixStore`` of the group name, torch's own
``_new_process_group_helper``, ``dist.broadcast`` from rank 0. Run by
test_publication_distributed.py against Gyre's WeightGroup: both must meet in one group.

    python torch_helper_member.py ADDR PORT RANK WORLD GROUP   # prints the received sums
"""

from __future__ import annotations

import inspect
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import (
    Backend,
    PrefixStore,
    _new_process_group_helper,
    _world,
    rendezvous,
)


def main() -> None:
    addr, port, rank, world, name = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
    timeout = timedelta(seconds=60)
    store, rank, world = next(rendezvous(f"tcp://{addr}:{port}", rank, world, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(name, store)
    params = inspect.signature(_new_process_group_helper).parameters
    opt = "backend_options" if "backend_options" in params else "pg_options"
    pg, _ = _new_process_group_helper(
        world, rank, [], Backend("gloo"), store, group_name=name, timeout=timeout, **{opt: None}
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}
    got = [torch.empty(3, 4), torch.empty(5, dtype=torch.bfloat16)]
    for t in got:
        dist.broadcast(t, src=0, group=pg)
    print(json.dumps([t.float().tolist() for t in got]))


if __name__ == "__main__":
    main()
