"""The workspace's disk quota: a watcher that stops a harness whose workspace grows too big.

No kernel quota is available to an ordinary user (or to root on most CI
filesystems), so the executor measures the workspace's allocated size
(``st_blocks``, so sparse files count for what they use) and its number of
entries (inodes: empty files cost no bytes, and a harness makes 100k a second)
every few seconds and stops the harness past either limit. The overshoot is
bounded by what can be written between two checks, each file by RLIMIT_FSIZE
(set inside the sandbox), and ``/tmp``/``$HOME``/``/dev/shm`` are sized tmpfs.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Literal

# The pause after a walk is at most this many check periods, however long the walk took: a
# pause proportional to the walk let a harness first make 300k files (a slow walk, so a long
# pause) and then write 400 MiB past a 64 MiB quota in it. The entry limit bounds the walk.
MAX_PAUSE_PERIODS = 5


def tree_usage(
    path: Path, max_bytes: int | None = None, max_entries: int | None = None
) -> tuple[int, int]:
    """(bytes allocated, entries) under ``path``; symlinks not followed, unreadable entries
    skipped. Stops counting as soon as either given limit is passed (the verdict is known)."""
    total = entries = 0
    todo = [str(path)]
    while todo:
        d = todo.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    entries += 1
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if e.is_dir(follow_symlinks=False):
                        todo.append(e.path)
                    if (max_bytes is not None and total > max_bytes) or (
                        max_entries is not None and entries > max_entries
                    ):
                        return total, entries
        except OSError:
            continue
    return total, entries


def tree_bytes(path: Path) -> int:
    """Bytes allocated under ``path`` (symlinks not followed; unreadable entries skipped)."""
    return tree_usage(path)[0]


async def watch_tree(
    path: Path, limit: int, every_s: float, max_entries: int = 0
) -> Literal["disk_limit"]:
    """Return ``"disk_limit"`` once ``path`` holds more than ``limit`` bytes or (when
    ``max_entries``) more than ``max_entries`` entries (cancel to stop).

    A walk of a big tree is not free (185 ms per 10,000 files on a busy 2-core
    machine), and dozens of executions each run one: the pause after a walk is
    20 times what the walk took, so a watcher stays under ~5% of a core -- but
    never more than ``MAX_PAUSE_PERIODS`` periods, so a big tree cannot buy itself
    a long unwatched window (the entry limit keeps each walk bounded instead).
    """
    pause = every_s
    cap = MAX_PAUSE_PERIODS * every_s
    files = max_entries or None
    while True:
        await asyncio.sleep(pause)
        t0 = time.monotonic()
        size, n = await asyncio.to_thread(tree_usage, path, limit, files)
        if size > limit or (files is not None and n > files):
            return "disk_limit"
        pause = min(cap, max(every_s, 20 * (time.monotonic() - t0)))
