"""Give a cell's freed memory back to the machine when it changes role.

A cell is one long-lived process that alternates an engine (its weights, K/V, the packed
copies of its linears) and a training replica (weights, gradients, optimizer state, the
activations of a micro-step). Freeing those tensors does not shrink the process: glibc keeps
the freed pages in its heaps, and the engine's server threads allocate from arenas of their
own, which glibc never trims by itself. Measured on SmolLM2-135M (one process, engine then 2
optimizer steps on 4x512 tokens, three rounds): 5.6-5.8 GB stay resident after each phase
without a trim, 0.47-0.53 GB with one, and the next engine phase peaks at 6.3-6.6 GB against
1.8 GB. Three cells carrying that much through their switches filled a 24 GB machine and
Ray's memory monitor killed them (the agent example, issue 35). So each switch ends with a
cyclic garbage collection (the engine's server and its app hold reference cycles) and
``malloc_trim(0)``, which returns the free pages of every arena.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import time
from functools import cache


def rss_mb() -> float:
    """This process's resident set (MiB), from /proc (0 where there is none)."""
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@cache
def _trim():
    """glibc's ``malloc_trim``, or None (musl, macOS: nothing to call)."""
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release() -> dict[str, float]:
    """Collect cycles and trim the heaps; returns the resident set before and after (MiB)
    and the seconds it took, for the switch record."""
    t0 = time.perf_counter()
    before = rss_mb()
    gc.collect()
    trim = _trim()
    if trim is not None:
        trim(0)
    after = rss_mb()
    return {
        "rss_mb": round(after, 1),
        "released_mb": round(max(before - after, 0.0), 1),
        "release_s": round(time.perf_counter() - t0, 4),
    }
