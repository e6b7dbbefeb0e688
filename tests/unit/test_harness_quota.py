"""The workspace quota watcher: allocated bytes, not apparent size; stops only past the limit."""

import asyncio
import os

import pytest

from gyre.harness.quota import tree_bytes, tree_usage, watch_tree


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


async def test_many_files_do_not_stretch_the_pause_past_the_quota(tmp_path):
    """A big tree makes every walk slow; the pause after a walk grew with it (20x the walk), so
    a harness that first made 300k files then wrote 400 MiB past a 64 MiB quota. The pause is
    capped: bytes written after the tree got big are still caught within a few checks."""
    many = tmp_path / "many"
    many.mkdir()
    for i in range(25_000):
        os.close(os.open(many / str(i), os.O_CREAT | os.O_WRONLY, 0o600))
    w = asyncio.ensure_future(watch_tree(tmp_path, 1 << 20, 0.1))
    await asyncio.sleep(1.0)  # at least one full (slow) walk done, under the limit
    assert not w.done()
    (tmp_path / "big").write_bytes(b"x" * (2 << 20))
    t0 = asyncio.get_running_loop().time()
    assert await asyncio.wait_for(w, 30) == "disk_limit"
    assert asyncio.get_running_loop().time() - t0 < 2.5


async def test_watch_tree_counts_entries(tmp_path):
    """Inodes are a quota too: 100k empty files a second cost no bytes."""
    for i in range(300):
        (tmp_path / str(i)).touch()
    w = asyncio.ensure_future(watch_tree(tmp_path, 1 << 30, 0.05, max_entries=1000))
    await asyncio.sleep(0.3)
    assert not w.done()
    for i in range(300, 1200):
        (tmp_path / str(i)).touch()
    assert await asyncio.wait_for(w, 5) == "disk_limit"


def test_tree_usage_stops_early_past_a_limit(tmp_path):
    for i in range(50):
        (tmp_path / str(i)).touch()
    assert tree_usage(tmp_path) == (0, 50)
    _, n = tree_usage(tmp_path, max_entries=10)
    assert 10 < n < 50  # stopped counting once over
