"""Memory and CPU of a whole process tree, sampled from /proc (Linux; no psutil needed).

A Gyre run is many processes: the driver (controller and proxy threads), Ray's GCS,
raylet and workers (one ``ray::Cell`` per cell), and a harness process plus its verifier
per execution. TRL is one process. :class:`TreeSampler` walks every descendant of a root
pid each ``interval_s`` and keeps the peak of the summed RSS and PSS (PSS splits shared
pages, such as the torch libraries every Ray worker maps, among the processes that share
them, so it does not count them once per process), and the last CPU seconds seen of each
process, by kind. A process that lives shorter than one interval can be missed: the CPU by
kind is a lower bound.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def kind_of(cmdline: str, comm: str) -> str:
    """A coarse class of a process of a run, from its command line."""
    if comm.startswith("ray::Cell") or "ray::Cell" in cmdline:
        return "cells"
    if comm.startswith("ray::") or "/ray/" in cmdline or comm in ("raylet", "gcs_server"):
        return "ray"
    if "reference_agent" in cmdline or "gyre.harness" in cmdline:
        return "harness"
    if "score.py" in cmdline or "test.sh" in cmdline:
        return "verifier"
    if "gyre" in cmdline or "trl_side" in cmdline:
        return "driver"
    return "other"


def _stat(pid: int) -> tuple[int, float] | None:
    """(ppid, CPU seconds) of ``pid``, or None when it is gone."""
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = s[s.rfind(")") + 2 :].split()
    return int(rest[1]), (int(rest[11]) + int(rest[12])) / TICK


def _mem_mb(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MB; PSS from smaps_rollup (0 when unreadable)."""
    rss = pss = 0.0
    try:
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) / 1024
                break
    except (OSError, ValueError, IndexError):
        pass
    return rss, pss


def _cmd(pid: int) -> tuple[str, str]:
    try:
        cmd = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "", ""
    return cmd, comm


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (one pass over /proc)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None:
                children.setdefault(st[0], []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


class TreeSampler:
    """Samples the tree under ``root`` in a daemon thread until :meth:`stop`."""

    def __init__(self, root: int, interval_s: float = 0.5):
        self.root, self.interval_s = root, interval_s
        self.peak_rss_mb = self.peak_pss_mb = 0.0
        self.peak_by_kind: dict[str, float] = {}  # PSS by kind at the PSS peak
        self.peak_processes = 0
        self.cpu: dict[int, tuple[str, float]] = {}  # pid -> (kind, last CPU seconds seen)
        self.samples = 0
        self._kinds: dict[int, str] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True, name="tree-sampler")

    def start(self) -> TreeSampler:
        self._t.start()
        return self

    def stop(self) -> dict:
        self._stop.set()
        self._t.join(timeout=10)
        return self.report()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def sample(self) -> None:
        rss = pss = 0.0
        by: dict[str, float] = {}
        pids = descendants(self.root)
        for pid in pids:
            st = _stat(pid)
            if st is None:
                continue
            k = self._kinds.get(pid)
            if k in (None, "ray"):  # a Ray worker renames itself when it becomes a cell
                k = self._kinds[pid] = kind_of(*_cmd(pid))
            r, p = _mem_mb(pid)
            rss, pss = rss + r, pss + p
            by[k] = by.get(k, 0.0) + p
            self.cpu[pid] = (k, st[1])
        self.samples += 1
        self.peak_rss_mb = max(self.peak_rss_mb, rss)
        if pss > self.peak_pss_mb:
            self.peak_pss_mb, self.peak_by_kind, self.peak_processes = pss, by, len(pids)

    def report(self) -> dict:
        cpu: dict[str, float] = {}
        for k, s in self.cpu.values():
            cpu[k] = cpu.get(k, 0.0) + s
        return {
            "peak_rss_mb": round(self.peak_rss_mb, 1),
            "peak_pss_mb": round(self.peak_pss_mb, 1),
            "peak_pss_by_kind_mb": {k: round(v, 1) for k, v in sorted(self.peak_by_kind.items())},
            "peak_processes": self.peak_processes,
            "cpu_s_by_kind": {k: round(v, 1) for k, v in sorted(cpu.items())},
            "cpu_s": round(sum(cpu.values()), 1),
            "processes_seen": len(self.cpu),
            "samples": self.samples,
            "interval_s": self.interval_s,
            "t": time.time(),
        }
