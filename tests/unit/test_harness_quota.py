"""The workspace quota watcher: allocated bytes, not apparent size; stops only past the limit."""

import asyncio
import os

import pytest

from gyre.harness.quota import tree_bytes, watch_tree


def test_tree_bytes_counts_allocated_blocks_and_skips_symlinks(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a").write_bytes(b"x" * (1 << 20))
    with open(tmp_path / "sparse", "wb") as f:  # 1 GiB apparent, nothing allocated
        f.truncate(1 << 30)
    os.symlink("/usr", tmp_path / "link")  # not followed
    n = tree_bytes(tmp_path)
    assert (1 << 20) <= n < (1 << 20) + (1 << 18)


async def test_watch_tree_fires_past_the_limit_only(tmp_path):
    (tmp_path / "f").write_bytes(b"x" * (256 << 10))
    w = asyncio.ensure_future(watch_tree(tmp_path, 1 << 20, 0.05))
    await asyncio.sleep(0.3)
    assert not w.done()  # under the limit: keeps watching
    (tmp_path / "g").write_bytes(b"x" * (2 << 20))
    assert await asyncio.wait_for(w, 5) == "disk_limit"


async def test_watch_tree_is_cancellable(tmp_path):
    w = asyncio.ensure_future(watch_tree(tmp_path, 1 << 20, 0.05))
    await asyncio.sleep(0.1)
    w.cancel()
    with pytest.raises(asyncio.CancelledError):
        await w
