"""A cell's switch gives freed memory back to the machine (gyre.runtime.heap)."""

from __future__ import annotations

import threading

from gyre.runtime.heap import release, rss_mb


def test_release_returns_a_threads_freed_heap_to_the_machine() -> None:
    """What an engine's server thread frees stays resident until trimmed: 400 MiB of small
    blocks (below glibc's mmap threshold, so from the thread's arena), all but every 16th
    freed (the survivors keep the heap from shrinking at its top, as live tensors do)."""
    held: list[bytearray] = []

    def fill() -> None:
        held.extend(bytearray(64 * 1024) for _ in range(6400))

    t = threading.Thread(target=fill)
    t.start()
    t.join()
    base = rss_mb()
    survivors = held[::16]
    held.clear()
    kept = rss_mb()
    r = release()
    assert base > 300  # the blocks were resident
    assert kept > base - 100  # freed, yet still resident
    assert kept - r["rss_mb"] > 250, (base, kept, r)  # the trim gave the holes back
    assert r["released_mb"] > 250 and r["release_s"] >= 0
    assert len(survivors) == 400
