"""The workspace's disk quota: a watcher that stops a harness whose workspace grows too big.

No kernel quota is available to an ordinary user (or to root on most CI
filesystems), so the executor measures the workspace's allocated size
(``st_blocks``, so sparse files count for what they use) every few seconds and
stops the harness past the limit. The overshoot is bounded by what can be
written between two checks, each file by RLIMIT_FSIZE (set inside the
sandbox), and ``/tmp``/``$HOME`` are sized tmpfs.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Literal


def tree_bytes(path: Path) -> int:
    """Bytes allocated under ``path`` (symlinks not followed; unreadable entries skipped)."""
    total, todo = 0, [str(path)]
    while todo:
        d = todo.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
        except OSError:
            continue
    return total


async def watch_tree(path: Path, limit: int, every_s: float) -> Literal["disk_limit"]:
    """Return ``"disk_limit"`` once ``path`` holds more than ``limit`` bytes (cancel to stop).

    A walk of a big tree is not free (185 ms per 10,000 files on a busy 2-core
    machine), and dozens of executions each run one: the pause after a walk is
    at least 20 times what the walk took, so a watcher stays under ~5% of a core
    (and a big workspace is checked less often).
    """
    pause = every_s
    while True:
        await asyncio.sleep(pause)
        t0 = time.monotonic()
        if await asyncio.to_thread(tree_bytes, path) > limit:
            return "disk_limit"
        pause = max(every_s, 20 * (time.monotonic() - t0))
